"""Ahead-of-time compilation: `filter_jit(f).lower(*args).compile()` is called with
`f`'s own arguments and returns `f`'s output (Equinox's convention)."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


class Affine(bw.Module):
    w: jax.Array
    name: str = "affine"

    def __call__(self, x):
        return self.w * x + 1


def _f(m, x, scale, **kwargs):
    return {"y": m(x) * scale, "tag": kwargs.get("tag"), "n": 3}


@pytest.mark.parametrize("donate", ["none", "all", "all-except-first"])
def test_compiled_takes_the_functions_arguments_like_equinox(donate):
    def args():
        return Affine(jnp.full(2, 3.0)), jnp.arange(2.0), 2.0

    ours = bw.filter_jit(_f, donate=donate).lower(*args(), tag="t").compile()
    with warnings.catch_warnings():  # Equinox's lowering keeps JAX's warning
        warnings.simplefilter("ignore")
        theirs = eqx.filter_jit(_f, donate=donate).lower(*args(), tag="t").compile()
    got, want = ours(*args(), tag="t"), theirs(*args(), tag="t")
    assert got["tag"] == want["tag"] == "t" and got["n"] == want["n"] == 3
    assert jnp.array_equal(got["y"], want["y"])


def test_compiler_options_reach_xla():
    lowered = bw.filter_jit(lambda x, y: 2 * x + y).lower(jnp.array(3), 4)
    compiled = lowered.compile(compiler_options={"xla_embed_ir_in_executable": True})
    assert compiled(jnp.array(3), 4) == 10
    with pytest.raises(jax.errors.JaxRuntimeError):
        lowered.compile(compiler_options={"not an option": "bad"})


def test_other_static_arguments_get_a_clear_error():
    compiled = bw.filter_jit(lambda x, n: x * n).lower(jnp.ones(2), 3).compile()
    assert jnp.array_equal(compiled(jnp.zeros(2) + 1, 3), jnp.full(2, 3.0))
    with pytest.raises(
        TypeError, match=r"lowered for other arguments.*lower\(\.\.\.\)"
    ):
        compiled(jnp.ones(2), 4)  # another static value
    with pytest.raises(TypeError, match=r"lowered for other arguments"):
        compiled((jnp.ones(2),), 3)  # another structure


def test_captured_arrays_are_read_at_each_compiled_call():
    w = jnp.ones(2)
    f = bw.filter_jit(lambda x: w * x)
    compiled = f.lower(jnp.ones(2)).compile()
    assert jnp.array_equal(compiled(jnp.full(2, 2.0)), jnp.full(2, 2.0))
    w = jnp.full(2, 5.0)  # rebinding a captured array is seen, as by `f` itself
    assert jnp.array_equal(compiled(jnp.full(2, 2.0)), jnp.full(2, 10.0))
    assert jnp.array_equal(f(jnp.full(2, 2.0)), jnp.full(2, 10.0))


def test_the_flat_form_stays_available():
    lowered = bw.filter_jit(lambda a, b: (a + b, "s")).lower(jnp.ones(2), jnp.ones(2))
    assert isinstance(lowered.flat, jax.stages.Lowered)
    assert "add" in lowered.as_text()  # attributes of JAX's `Lowered`
    compiled = lowered.compile()
    (out,) = compiled.flat([jnp.ones(2), jnp.ones(2)])
    assert jnp.array_equal(out, jnp.full(2, 2.0))
    assert compiled(jnp.ones(2), jnp.ones(2))[1] == "s"
    # shown by class and function, with no `boxwood.` prefix: neither class is a
    # public name
    name = "test_the_flat_form_stays_available.<locals>.<lambda>"
    assert repr(lowered) == f"Lowered({name})"
    assert repr(compiled) == f"Compiled({name})"


def _train_step(model, x, state):
    def loss(m):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    value, grads = bw.filter_value_and_grad(loss)(model)
    model = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, model, grads)
    return model, state + 1, value


def _mlp():
    return bw.nn.MLP(4, 2, 8, 1, key=jax.random.key(0))


def test_abstract_arrays_lower_as_jax_jit_lowers_them():
    # A model of `jax.ShapeDtypeStruct`s (no parameter ever made) lowers to the
    # program that its concrete arrays give, and compiles from shapes alone.
    model, x, state = _mlp(), jnp.ones((3, 4)), jnp.zeros((), jnp.int32)
    abstract = bw.filter_eval_shape(_mlp)
    assert isinstance(abstract.layers[0].weight, jax.ShapeDtypeStruct)
    x_struct = jax.ShapeDtypeStruct(x.shape, x.dtype)
    state_struct = jax.ShapeDtypeStruct((), jnp.int32)
    step = bw.filter_jit(_train_step)
    lowered = step.lower(abstract, x_struct, state_struct)
    assert lowered.as_text() == step.lower(model, x, state).as_text()
    compiled = lowered.compile()
    assert compiled.memory_analysis().argument_size_in_bytes >= 4 * (3 * 4 + 8 * 4)
    assert "dot" in compiled.as_text()
    # the compiled program takes the concrete arguments it was lowered for
    new, count, value = compiled(model, x, state)
    want = step(model, x, state)
    assert bw.tree_equal(new, want[0]) and count == 1 and value == want[2]


def test_abstract_arrays_with_a_sharding_lower_and_stay_static_in_calls():
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=sharding)
    lowered = bw.filter_jit(lambda x, n: x * n).lower(x, 3)
    assert lowered.compile()(jnp.ones(2), 3).tolist() == [3.0, 3.0]
    # a call (not a lowering) takes a ShapeDtypeStruct as a static value, as
    # `eqx.filter_jit` does
    shape = bw.filter_jit(lambda s: jnp.zeros(s.shape, s.dtype))(x)
    assert shape.shape == (2,)
