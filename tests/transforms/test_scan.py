"""`filter_scan` against unrolled Python loops."""

from collections.abc import Callable

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood


class Layer(boxwood.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = boxwood.field(static=True)
    name: str = "layer"  # a non-array leaf: passed to every step unchanged

    def __call__(self, x):
        return self.activation(self.weight @ x + self.bias)


def _stack(getkey, depth=4, width=3):
    weight = jr.normal(getkey(), (depth, width, width)) / width
    bias = jr.normal(getkey(), (depth, width))
    return Layer(weight, bias, jnp.tanh)


def _layer(stacked, i):
    return jax.tree.map(lambda a: a[i] if boxwood.is_array(a) else a, stacked)


def test_scan_over_stacked_layers_matches_unrolled(getkey):
    layers, x = _stack(getkey), jr.normal(getkey(), (3,))
    out, ys = boxwood.filter_scan(lambda h, layer: (layer(h), None), x, layers)
    assert ys is None
    expected = x
    for i in range(4):
        expected = _layer(layers, i)(expected)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_non_array_leaves_of_xs_reach_every_step(getkey):
    layers = _stack(getkey)
    names = []

    def step(h, layer):
        names.append(layer.name)
        assert layer.activation is jnp.tanh
        return h, layer.weight.shape

    _, ys = boxwood.filter_scan(step, jnp.zeros(3), layers)
    assert names and set(names) == {"layer"}
    assert ys == (3, 3)  # a non-array output: returned as the step produced it


def test_carry_with_module_and_python_int(getkey):
    layer = _layer(_stack(getkey), 0)
    xs = jr.normal(getkey(), (5, 3))

    def step(carry, x):
        model, count, total = carry
        y = model(x)
        return (model, count, total + jnp.sum(y)), {"y": y, "count": count}

    (model, count, total), ys = boxwood.filter_scan(step, (layer, 3, jnp.zeros(())), xs)
    assert count == 3 and isinstance(count, int)
    assert model.activation is jnp.tanh
    np.testing.assert_array_equal(model.weight, layer.weight)
    expected = jnp.stack([layer(x) for x in xs])
    np.testing.assert_allclose(ys["y"], expected, rtol=1e-5, atol=1e-6)
    assert ys["count"] == 3
    np.testing.assert_allclose(total, jnp.sum(expected), rtol=1e-5)


def test_changing_arrays_of_a_module_in_the_carry(getkey):
    layer = _layer(_stack(getkey), 0)

    def step(m, x):
        return boxwood.tree_at(lambda m: m.bias, m, m.bias + x), jnp.sum(m.bias)

    final, sums = boxwood.filter_scan(step, layer, jnp.ones((3, 3)))
    np.testing.assert_allclose(final.bias, layer.bias + 3, rtol=1e-6)
    np.testing.assert_allclose(
        sums, [jnp.sum(layer.bias + i) for i in range(3)], rtol=1e-5
    )


def test_reverse_length_unroll():
    xs = jnp.arange(4.0)
    step = lambda c, x: (c * 10 + x, c)  # noqa: E731
    fwd, _ = boxwood.filter_scan(step, jnp.zeros(()), xs, unroll=2)
    rev, ys = boxwood.filter_scan(step, jnp.zeros(()), xs, reverse=True)
    assert fwd == 123.0 and rev == 3210.0
    np.testing.assert_array_equal(ys, [321.0, 32.0, 3.0, 0.0])
    count, _ = boxwood.filter_scan(
        lambda c, _: (c + 1, None), jnp.array(0), None, length=5
    )
    assert count == 5


def test_under_jit_and_grad(getkey):
    layers, x = _stack(getkey), jr.normal(getkey(), (3,))

    def run(layers, x):
        return jnp.sum(
            boxwood.filter_scan(lambda h, layer: (layer(h), None), x, layers)[0]
        )

    def unrolled(layers, x):
        for i in range(4):
            x = _layer(layers, i)(x)
        return jnp.sum(x)

    # the unrolled reference compiled (eagerly, its slicing and each layer's
    # operations, forward and backward, compile one by one)
    value_and_grad = boxwood.filter_jit(boxwood.filter_value_and_grad(unrolled))
    want, expected = value_and_grad(layers, x)
    np.testing.assert_allclose(boxwood.filter_jit(run)(layers, x), want, rtol=1e-5)
    got = boxwood.filter_grad(run)(layers, x)
    np.testing.assert_allclose(got.weight, expected.weight, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.bias, expected.bias, rtol=1e-4, atol=1e-6)


_leaf = st.one_of(
    st.just(jnp.arange(2.0)),
    st.just(jnp.arange(3)),
    st.integers(-3, 3),
    st.sampled_from(["a", "b"]),
)
_tree = st.recursive(
    _leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.tuples(c, c)), max_leaves=5
)


@settings(max_examples=10, deadline=None)
@given(_tree, _tree)
def test_random_pytrees_match_a_loop(init, x_example):
    n = 3
    xs = jax.tree.map(
        lambda a: (
            jnp.stack([a * (i + 1) for i in range(n)]) if boxwood.is_array(a) else a
        ),
        x_example,
    )

    def step(carry, x):
        x_sum = sum(
            (
                jnp.sum(a).astype(jnp.float32)
                for a in jax.tree_util.tree_leaves(x)
                if boxwood.is_array(a)
            ),
            jnp.zeros(()),
        )
        new = jax.tree.map(
            lambda a: a + a.dtype.type(1) if boxwood.is_array(a) else a, carry
        )
        return new, (x, x_sum)

    carry, (ys, sums) = boxwood.filter_scan(step, init, xs, length=n)
    expected_carry, expected_sums = init, []
    for i in range(n):
        x_i = _layer(xs, i)
        expected_carry, (_, s) = step(expected_carry, x_i)
        expected_sums.append(s)
    assert jax.tree_util.tree_structure(carry) == jax.tree_util.tree_structure(init)
    for a, b in zip(
        jax.tree_util.tree_leaves(carry), jax.tree_util.tree_leaves(expected_carry)
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(sums, jnp.stack(expected_sums), rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(ys), jax.tree_util.tree_leaves(xs)):
        np.testing.assert_array_equal(a, b)


def test_changing_a_static_leaf_of_the_carry_is_an_error():
    with pytest.raises(
        ValueError, match=r"changed the carry leaf `carry\[1\]` from int 3 to int 4"
    ):
        boxwood.filter_scan(
            lambda c, x: ((c[0] + x, c[1] + 1), None), (jnp.zeros(()), 3), jnp.ones(2)
        )


def test_changing_the_carry_structure_is_an_error():
    with pytest.raises(ValueError, match="carry whose structure differs"):
        boxwood.filter_scan(lambda c, x: ((c, c), None), jnp.zeros(()), jnp.ones(2))


def test_replacing_an_array_by_a_non_array_is_an_error():
    with pytest.raises(ValueError, match=r"`carry\[0\]` from an array of shape \(\)"):
        boxwood.filter_scan(
            lambda c, x: (("x", c[1]), None), (jnp.zeros(()), 1), jnp.ones(2)
        )


def test_python_float_carry_changing_is_an_error():
    with pytest.raises(ValueError, match=r"make it an array in `init`"):
        boxwood.filter_scan(lambda c, x: (c + 1.0, None), 0.0, jnp.ones(2))


def test_step_must_return_a_pair():
    with pytest.raises(TypeError, match=r"must return a pair `\(carry, y\)`; got list"):
        boxwood.filter_scan(lambda c, x: [c, x], jnp.zeros(()), jnp.ones(2))


def test_scalar_array_in_xs_is_an_error():
    with pytest.raises(ValueError, match=r"`xs\[1\]` is a scalar array"):
        boxwood.filter_scan(
            lambda c, x: (c, None), jnp.zeros(()), (jnp.ones(2), jnp.ones(()))
        )


def test_mismatched_leading_axes_are_an_error():
    with pytest.raises(ValueError, match=r"it is 2 for xs\[0\], 3 for xs\[1\]"):
        boxwood.filter_scan(
            lambda c, x: (c, None), jnp.zeros(()), (jnp.ones(2), jnp.ones(3))
        )
    with pytest.raises(ValueError, match=r"2 for xs, 5 for `length`"):
        boxwood.filter_scan(
            lambda c, x: (c, None), jnp.zeros(()), jnp.ones(2), length=5
        )
