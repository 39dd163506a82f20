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
