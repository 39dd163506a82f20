"""Modules' remembered flat forms and the argument walk (`boxwood._module._flat_key`)."""

import copy
import dataclasses
import pickle
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood._module._flat_form import FLAT
from boxwood._module._module import instance_dict

# every test runs on the compiled and the Python warm-call path (conftest.py)


class Lin(bw.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(self.weight @ x + self.bias)


class Net(bw.Module):
    layers: tuple

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class ListNet(bw.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def net(cls=Net, n=2, scale=1.0):
    layers = [Lin(jnp.eye(3) * scale, jnp.zeros(3)) for _ in range(n)]
    return cls(tuple(layers) if cls is Net else layers)


def test_repeated_module_argument_is_not_reflattened(count_flattens):
    f = bw.filter_jit(lambda m, x: m(x))
    model = net()
    for i in range(2):  # first sight, then remembered
        f(model, jnp.full(3, float(i)))
    before = count_flattens["n"]
    for i in range(5):
        out = f(model, jnp.full(3, float(i)))
        assert jnp.allclose(out, model(jnp.full(3, float(i))))
    assert count_flattens["n"] == before
    assert f.cache_info().traces == 1 and f.cache_info().hits == 6


def test_new_model_objects_take_the_flatten_path_and_stay_correct(count_flattens):
    f = bw.filter_jit(lambda m, x: m(x))
    model = net()
    f(model, jnp.ones(3))
    f(model, jnp.ones(3))
    other = net(scale=2.0)  # same structure, other arrays, other object
    before = count_flattens["n"]
    assert jnp.allclose(f(other, jnp.ones(3)), other(jnp.ones(3)))
    assert count_flattens["n"] == before + 1
    changed = bw.tree_at(lambda m: m.layers[0].bias, model, jnp.ones(3))
    assert jnp.allclose(f(changed, jnp.ones(3)), changed(jnp.ones(3)))


def test_modules_holding_lists_are_always_flattened(count_flattens):
    f = bw.filter_jit(lambda m, x: m(x))
    model = net(ListNet)
    f(model, jnp.ones(3))  # compiles (the trace flattens the output too)
    before = count_flattens["n"]
    for _ in range(3):
        f(model, jnp.ones(3))
    assert count_flattens["n"] == before + 3
    model.layers.append(Lin(jnp.eye(3) * 3, jnp.zeros(3)))  # mutated in place
    assert jnp.allclose(f(model, jnp.ones(3)), model(jnp.ones(3)))


def test_copies_and_pickles_do_not_carry_the_flat_form():
    f = bw.filter_jit(lambda m, x: m(x))
    model = net()
    f(model, jnp.ones(3))
    f(model, jnp.ones(3))
    assert FLAT in instance_dict(model)
    for other in (
        copy.copy(model),
        copy.deepcopy(model),
        pickle.loads(pickle.dumps(model)),
    ):
        assert FLAT not in instance_dict(other)
        assert jnp.allclose(f(other, jnp.ones(3)), model(jnp.ones(3)))


class AdamLike(NamedTuple):
    count: jax.Array
    mu: Net
    nu: Net


class Empty(NamedTuple):
    pass


@jax.numpy_dtype_promotion("standard")
def test_training_loop_outputs_are_not_reflattened(count_flattens):
    """What one step returns (the model, a tuple of NamedTuples holding modules, a
    loss) is passed to the next step without flattening."""

    @bw.filter_jit
    def step(model, state, x, lr):
        loss, grads = bw.filter_value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        adam, empty = state
        mu = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, adam.mu, grads)
        model = jax.tree_util.tree_map(lambda p, m: p - lr * m, model, mu)
        return model, (AdamLike(adam.count + 1, mu, adam.nu), empty), loss

    def reference(model, state, x, lr, steps):
        for _ in range(steps):
            model, state, loss = step.__wrapped__(model, state, x, lr)
        return model, state, loss

    model = net(n=3)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, model)
    state = (AdamLike(jnp.array(0), zeros, zeros), Empty())
    x = jnp.arange(3.0)
    m, s = model, state
    for _ in range(2):  # compiles (the second call: weak types settle)
        m, s, _ = step(m, s, x, 0.1)
    before, traces = count_flattens["n"], step.cache_info().traces
    for _ in range(4):
        m, s, loss = step(m, s, x, 0.1)
    assert count_flattens["n"] == before
    assert (
        step.cache_info().traces == traces == 1
    )  # the fast path passes what the slow path passed
    ref = reference(model, state, x, 0.1, 6)
    assert bw.tree_equal(
        jax.tree_util.tree_map(np.asarray, (m, s, loss)),
        jax.tree_util.tree_map(np.asarray, ref),
        rtol=1e-6,
        atol=1e-6,
    )
    # a different Python scalar is a different static value: it compiles again
    m2, _, _ = step(m, s, x, 0.5)
    assert step.cache_info().traces == traces + 1
    assert not bw.tree_equal(m2, step(m, s, x, 0.1)[0])


def test_static_scalars_of_equal_value_but_other_type_are_told_apart():
    f = bw.filter_jit(lambda m, x, k: (m(x), k))
    model = net()
    for k in (1, True, 1.0, 1, True):
        for _ in range(2):
            out, back = f(model, jnp.ones(3), k)
            assert back is k
    assert f.cache_info().traces == 3


def test_a_modified_copy_of_a_remembered_module_is_not_confused_with_it():
    f = bw.filter_jit(lambda m, x: (m, m(x)))
    model, _ = f(net(), jnp.ones(3))  # returned by filter_jit: carries its flat form
    assert FLAT in instance_dict(model)
    changed = bw.tree_at(lambda m: m.layers[1].weight, model, jnp.eye(3) * 5)
    mapped = jax.tree_util.tree_map(lambda a: a * 2, model)
    assert FLAT not in instance_dict(changed) and FLAT not in instance_dict(mapped)
    for other in (changed, mapped, changed, mapped):
        assert jnp.allclose(f(other, jnp.ones(3))[1], other(jnp.ones(3)))


def test_nested_tuples_lists_and_none_take_the_fast_path(count_flattens):
    f = bw.filter_jit(lambda pair, xs: pair[0](xs[0]) + xs[1])
    model, _ = bw.filter_jit(lambda m: (m, 0))(net())
    pair = (model, None)
    for _ in range(2):
        f(pair, [jnp.ones(3), jnp.ones(3)])
    before = count_flattens["n"]
    out = f(pair, [jnp.ones(3), 2 * jnp.ones(3)])
    assert count_flattens["n"] == before
    assert jnp.allclose(out, model(jnp.ones(3)) + 2.0)


class Reversed(NamedTuple):
    a: object
    b: object


jax.tree_util.register_pytree_node(
    Reversed, lambda t: ((t.b, t.a), None), lambda _, c: Reversed(c[1], c[0])
)


def test_tuple_types_with_their_own_flatten_are_never_walked(count_flattens):
    """A NamedTuple registered with a custom flatten (here: children reversed) is
    left to the real flatten, so the arguments keep jax's order."""
    f = bw.filter_jit(lambda t: t.a - t.b)
    a, b = jnp.ones(2), jnp.full(2, 3.0)
    for _ in range(3):
        assert jnp.allclose(f(Reversed(a, b)), -2.0)
    before = count_flattens["n"]
    f(Reversed(a, b))
    assert count_flattens["n"] == before + 1


def test_outputs_holding_constants_are_remembered_with_them(count_flattens):
    class Scaled(bw.Module):
        layer: Lin
        scale: float  # a dynamic field holding a Python float: a constant output

    f = bw.filter_jit(lambda m: Scaled(m, 2.0))
    out = f(net().layers[0])
    token, arrays = instance_dict(out)[FLAT]
    assert (
        token.statics == ((2, 2.0),) and len(arrays) == 2
    )  # the constant: in the token
    assert out.scale == 2.0 and type(out.scale) is float
    g = bw.filter_jit(lambda s, x: s.layer(x) * s.scale)
    g(out, jnp.ones(3))
    before = count_flattens["n"]
    for _ in range(3):
        assert jnp.allclose(g(out, jnp.ones(3)), 2 * out.layer(jnp.ones(3)))
    assert count_flattens["n"] == before  # walked, not flattened


def test_outputs_rebuilt_inside_an_outer_trace_stay_correct():
    inner = bw.filter_jit(lambda m: jax.tree_util.tree_map(lambda a: a + 1, m))
    apply = bw.filter_jit(lambda m, x: m(x))

    @jax.jit
    def outer(model, x):
        m = inner(model)
        return apply(m, x), apply(inner(m), x)

    model = net()
    a, b = outer(model, jnp.ones(3))
    plus1 = jax.tree_util.tree_map(lambda a: a + 1, model)
    plus2 = jax.tree_util.tree_map(lambda a: a + 2, model)
    assert jnp.allclose(a, plus1(jnp.ones(3))) and jnp.allclose(b, plus2(jnp.ones(3)))


def test_donated_fast_path_donates_the_right_buffers():
    step = bw.filter_jit(
        lambda x, m: jax.tree_util.tree_map(lambda a: a * 2, m),
        donate="all-except-first",
    )
    model = net()
    x = jnp.ones(3)
    for _ in range(4):
        old = jax.tree_util.tree_leaves(model)
        model = step(x, model)
        assert all(a.is_deleted() for a in old) and not x.is_deleted()
    assert jnp.allclose(model.layers[0].weight, jnp.eye(3) * 16)


def test_dict_arguments_take_the_fast_path_in_sorted_key_order(count_flattens):
    f = bw.filter_jit(lambda m, batch: m(batch["x"]) - batch["y"])
    model, _ = bw.filter_jit(lambda m: (m, 0))(net())
    x, y = jnp.arange(3.0), jnp.ones(3)
    for _ in range(2):
        f(model, {"y": y, "x": x})
    before = count_flattens["n"]
    for batch in ({"y": y, "x": x}, {"x": x, "y": y}):  # either insertion order
        assert jnp.allclose(f(model, batch), model(x) - y)
    assert count_flattens["n"] == before
    assert f.cache_info().traces == 1


@jax.numpy_dtype_promotion("standard")  # optax's Adam mixes int32 counts and floats
def test_optax_training_step_flattens_nothing_after_the_first_steps(
    count_flattens, getkey
):
    import optax

    model = bw.nn.MLP(3, 2, width_size=8, depth=2, key=getkey())
    tx = optax.adam(1e-2)

    @bw.filter_jit
    def step(model, opt_state, batch):
        def loss(m):
            return jnp.mean((jax.vmap(m)(batch["x"]) - batch["y"]) ** 2)

        value, grads = bw.filter_value_and_grad(loss)(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return bw.apply_updates(model, updates), opt_state, value

    batch = {"x": jnp.ones((4, 3)), "y": jnp.zeros((4, 2))}
    opt_state = tx.init(bw.filter(model, bw.is_inexact_array))
    losses = []
    for i in range(8):
        if i == 2:
            before = count_flattens["n"]
        model, opt_state, value = step(model, opt_state, batch)
        losses.append(float(value))
    assert count_flattens["n"] == before
    assert step.cache_info().traces == 1
    assert losses[-1] < losses[0]


def test_returned_modules_build_their_fields_on_first_read():
    """A module returned by filter_jit holds its flat form only; its fields (and
    nested modules) are built the first time something reads them, once."""
    f = bw.filter_jit(lambda m: jax.tree_util.tree_map(lambda a: a * 2, m))
    eager = jax.tree_util.tree_map(lambda a: a * 2, net())
    out = f(net())
    assert "layers" not in instance_dict(out) and FLAT in instance_dict(out)
    layers = out.layers
    assert "layers" in instance_dict(out) and out.layers is layers  # built once
    assert out == eager and repr(out) == repr(eager)
    for other in (f(net()), f(net()), f(net())):  # any reader materialises
        assert jnp.array_equal(jax.tree_util.tree_leaves(other)[0], jnp.eye(3) * 2)
        assert copy.copy(other) == eager and pickle.loads(pickle.dumps(other)) == eager
        assert dataclasses.replace(other).layers[1].bias.shape == (3,)


def test_concurrent_first_reads_see_the_same_objects():
    f = bw.filter_jit(lambda m: m)
    out = f(net(n=8))
    barrier = threading.Barrier(6)
    seen = []

    def read():
        barrier.wait()
        seen.append(out.layers)

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s is out.layers for s in seen)


def test_class_level_field_reads_and_unset_fields():
    class WithDefault(bw.Module):
        a: jax.Array
        b: float = 2.5

        def __init__(self, a, peek=False):
            if peek:
                _ = self.a + 1  # read before it is set
            self.a = a

    assert WithDefault.b == 2.5
    with pytest.raises(
        AttributeError, match="type object 'WithDefault' has no attribute 'a'"
    ):
        _ = WithDefault.a
    with pytest.raises(
        AttributeError, match="'WithDefault' object has no attribute 'a'"
    ):
        WithDefault(jnp.ones(1), peek=True)
    assert WithDefault(jnp.ones(1)).b == 2.5
