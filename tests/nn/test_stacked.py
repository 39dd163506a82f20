"""`boxwood.nn.Stacked` against the unrolled sequence of its layers."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.nn


class Block(boxwood.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = boxwood.field(static=True)

    def __init__(self, width, *, key):
        k1, k2 = jr.split(key)
        self.weight = jr.normal(k1, (width, width)) / width
        self.bias = jr.normal(k2, (width,))
        self.activation = jnp.tanh

    def __call__(self, x):
        return x + self.activation(self.weight @ x + self.bias)


class NoisyBlock(Block):
    def __call__(self, x, *, key):
        return super().__call__(x) + 0.1 * jr.normal(key, x.shape)


def _layer(stacked, i):
    return jax.tree.map(lambda a: a[i], stacked.layers)


def _unrolled(stacked, x, key=None):
    keys = [None] * stacked.depth if key is None else jr.split(key, stacked.depth)
    for i, k in enumerate(keys):
        layer = _layer(stacked, i)
        x = layer(x) if k is None else layer(x, key=k)
    return x


def test_layers_are_stacked(getkey):
    key = getkey()
    stacked = boxwood.nn.Stacked(lambda k: Block(3, key=k), 4, key=key)
    assert stacked.layers.weight.shape == (4, 3, 3)
    assert stacked.layers.activation is jnp.tanh
    for i, k in enumerate(jr.split(key, 4)):
        np.testing.assert_allclose(
            _layer(stacked, i).weight, Block(3, key=k).weight, rtol=1e-6
        )


@pytest.mark.parametrize("remat", [False, True])
def test_equals_unrolled(getkey, remat):
    stacked = boxwood.nn.Stacked(
        lambda k: Block(3, key=k), 4, key=getkey(), remat=remat
    )
    x = jr.normal(getkey(), (3,))
    np.testing.assert_allclose(stacked(x), _unrolled(stacked, x), rtol=1e-5, atol=1e-6)


def test_gradients_equal_unrolled_with_and_without_remat(getkey):
    key, x = getkey(), jr.normal(getkey(), (3,))
    plain = boxwood.nn.Stacked(lambda k: Block(3, key=k), 3, key=key)
    remat = boxwood.nn.Stacked(lambda k: Block(3, key=k), 3, key=key, remat=True)
    grad_unrolled = boxwood.filter_grad(lambda s, x: jnp.sum(_unrolled(s, x) ** 2))
    grad_stacked = boxwood.filter_grad(lambda s, x: jnp.sum(s(x) ** 2))
    expected = boxwood.filter_jit(grad_unrolled)(plain, x)
    for model in (plain, remat):
        got = boxwood.filter_jit(grad_stacked)(model, x)
        np.testing.assert_allclose(
            got.layers.weight, expected.layers.weight, rtol=1e-4, atol=1e-6
        )
        np.testing.assert_allclose(
            got.layers.bias, expected.layers.bias, rtol=1e-4, atol=1e-6
        )


@pytest.mark.parametrize("remat", [False, True])
def test_jax_jit(getkey, remat):
    stacked = boxwood.nn.Stacked(
        lambda k: Block(3, key=k), 5, key=getkey(), remat=remat
    )
    x = jr.normal(getkey(), (3,))
    np.testing.assert_allclose(
        jax.jit(lambda s, x: s(x))(stacked, x),
        _unrolled(stacked, x),
        rtol=1e-5,
        atol=1e-6,
    )
    grad = jax.jit(jax.grad(lambda s, x: jnp.sum(s(x))))(stacked, x)
    assert grad.layers.weight.shape == (5, 3, 3)


def test_key_is_split_per_layer(getkey):
    stacked = boxwood.nn.Stacked(lambda k: NoisyBlock(3, key=k), 3, key=getkey())
    x, key = jr.normal(getkey(), (3,)), getkey()
    np.testing.assert_allclose(
        stacked(x, key=key), _unrolled(stacked, x, key), rtol=1e-5, atol=1e-6
    )
    assert not jnp.allclose(stacked(x, key=key), stacked(x, key=getkey()))


def test_layers_without_key_are_called_without_one(getkey):
    stacked = boxwood.nn.Stacked(lambda k: Block(3, key=k), 2, key=getkey())
    with pytest.raises(TypeError, match="unexpected keyword argument 'key'"):
        stacked(jnp.ones(3), key=getkey())
    np.testing.assert_allclose(
        stacked(jnp.ones(3)), _unrolled(stacked, jnp.ones(3)), rtol=1e-5
    )


def test_ensemble_of_stacks_under_vmap(getkey):
    x = jr.normal(getkey(), (3,))
    keys = jr.split(getkey(), 2)

    @boxwood.filter_jit
    def build_and_apply(keys, x):
        make = lambda k: boxwood.nn.Stacked(lambda kk: Block(3, key=kk), 2, key=k)  # noqa: E731
        stacks = boxwood.filter_vmap(make)(keys)
        return boxwood.filter_vmap(lambda s: s(x))(stacks)

    out = build_and_apply(keys, x)
    for i, k in enumerate(keys):
        single = boxwood.nn.Stacked(lambda kk: Block(3, key=kk), 2, key=k)
        np.testing.assert_allclose(out[i], single(x), rtol=1e-5, atol=1e-6)


def test_depth_and_remat_are_static(getkey):
    stacked = boxwood.nn.Stacked(lambda k: Block(3, key=k), 2, key=getkey(), remat=True)
    leaves = jax.tree_util.tree_leaves(stacked)
    assert len(leaves) == 2  # weight and bias only
    assert stacked.depth == 2 and stacked.remat is True


@pytest.mark.parametrize("depth", [0, -1, 2.0, True])
def test_bad_depth_is_an_error(getkey, depth):
    with pytest.raises(
        ValueError, match=r"Stacked: `depth` must be a positive int, got"
    ):
        boxwood.nn.Stacked(lambda k: Block(3, key=k), depth, key=getkey())
