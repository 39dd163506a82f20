"""`boxwood.nn.Stacked` as a sequence of layers (`len`, indexing, iteration), its
`scan` over layers with extra per-layer inputs, and its `remat` settings."""

import jax
import jax.extend
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.nn
from _jaxprs import primitive_names


class Block(boxwood.Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, width, *, key):
        k1, k2 = jr.split(key)
        self.weight = jr.normal(k1, (width, width)) / width
        self.bias = jr.normal(k2, (width,))

    def __call__(self, x):
        return x + jnp.tanh(self.weight @ x + self.bias)


def _stack(key, depth=4, **kwargs):
    return boxwood.nn.Stacked(lambda k: Block(3, key=k), depth, key=key, **kwargs)


def test_len_index_and_iteration(getkey):
    stacked = _stack(getkey())
    assert len(stacked) == 4
    np.testing.assert_array_equal(stacked[1].weight, stacked.layers.weight[1])
    np.testing.assert_array_equal(stacked[-1].bias, stacked.layers.bias[3])
    assert isinstance(stacked[0], Block) and stacked[0].weight.shape == (3, 3)
    x = jr.normal(getkey(), (3,))
    y = x
    for layer in stacked:
        y = layer(y)
    np.testing.assert_allclose(stacked(x), y, rtol=1e-5, atol=1e-6)
    assert len(list(stacked)) == 4


def test_bad_index(getkey):
    stacked = _stack(getkey())
    with pytest.raises(IndexError, match="layer -5 is out of range for a stack of 4"):
        stacked[-5]
    with pytest.raises(TypeError, match="a layer index must be an int, got slice"):
        stacked[1:2]  # pyright: ignore[reportArgumentType]


def test_scan_with_per_layer_inputs(getkey):
    stacked = _stack(getkey())
    scales = jnp.arange(1.0, 5.0)

    def step(layer, h, scale):
        h = layer(h) * scale
        return h, jnp.sum(h)

    x = jr.normal(getkey(), (3,))
    out, sums = stacked.scan(step, x, scales)
    expected, expected_sums = x, []
    for i, layer in enumerate(stacked):
        expected = layer(expected) * scales[i]
        expected_sums.append(jnp.sum(expected))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sums, jnp.stack(expected_sums), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "remat, stored, checkpointed",
    [
        (False, False, False),
        (None, False, False),
        (True, True, True),
        ("full", True, True),
        ("dots_saveable", "dots_saveable", True),
        (jax.checkpoint_policies.nothing_saveable, None, True),
    ],
)
def test_remat_settings(getkey, remat, stored, checkpointed):
    stacked = _stack(getkey(), remat=remat)
    if stored is None:
        assert stacked.remat is remat
    else:
        assert stacked.remat == stored
    grad = jax.grad(lambda s, x: jnp.sum(s(x) ** 2))
    x = jr.normal(getkey(), (3,))
    names = primitive_names(jax.make_jaxpr(grad)(stacked, x).jaxpr)
    assert any("remat" in n or "checkpoint" in n for n in names) == checkpointed
    plain = grad(stacked.with_remat(False), x)
    np.testing.assert_allclose(
        grad(stacked, x).layers.weight, plain.layers.weight, rtol=1e-4, atol=1e-6
    )


def test_with_remat_copies(getkey):
    stacked = _stack(getkey())
    again = stacked.with_remat("full")
    assert again.remat is True and stacked.remat is False
    assert again.layers.weight is stacked.layers.weight


def test_bad_remat(getkey):
    with pytest.raises(ValueError, match=r"`remat` must be .*got 'dots'"):
        _stack(getkey(), remat="dots")
    with pytest.raises(ValueError, match=r"`remat` must be .*got 3"):
        _stack(getkey()).with_remat(3)
