"""Differential tests against the installed Equinox for the layer behaviours
boxwood takes from it: the attention functions, non-boolean masks, complex
convolutions, negative embedding indices, integer inputs to average pools and
PReLU, adaptive-pool bins and RoPE under strict dtype promotion."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood.nn as bnn
from boxwood.nn import _attention

eqx = pytest.importorskip("equinox")


def _normal(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _both(ours, theirs, *args):
    """`(ours(*args), theirs(*args))`, compiled as one program: run eagerly, each
    operation of the two layers would compile on its own. (A layer's eager-only
    path, `Embedding`'s range check of a concrete index, is tested eagerly.)"""
    return jax.jit(lambda *a: (ours(*a), theirs(*a)))(*args)


def _attention_both(q, k, v, mask):
    theirs = eqx.nn._attention
    return (
        _attention.dot_product_attention_weights(q, k, mask),
        theirs.dot_product_attention_weights(q, k, mask),
        _attention.dot_product_attention(q, k, v, mask),
        theirs.dot_product_attention(q, k, v, mask),
    )


# float16 runs eagerly: compiled for the CPU, `jax.nn.dot_product_attention` (jax
# 0.10.2) asks for a float16 product accumulated in float32, which the CPU refuses.
_ATTENTION_BOTH = {jnp.float32: jax.jit(_attention_both), jnp.float16: _attention_both}


def _exact_attention(q, k, v, mask):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = q @ k.T / np.sqrt(q.shape[-1])
    if mask is not None:
        logits = np.where(np.asarray(mask), logits, -np.inf)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_dot_product_attention_functions(dtype):
    q, k, v = (_normal(i, n, 4).astype(dtype) for i, n in enumerate((3, 5, 5)))
    mask = jnp.arange(15).reshape(3, 5) % 4 != 1
    for m in (None, mask):
        ours_w, their_w, ours, their_out = _ATTENTION_BOTH[dtype](q, k, v, m)
        assert ours_w.dtype == their_w.dtype == dtype
        np.testing.assert_allclose(ours_w, their_w, rtol=1e-6)
        # float16 goes through `jax.nn.dot_product_attention`, whose float32 logits
        # may round the last bit differently.
        tol = dict(rtol=1e-6) if dtype == jnp.float32 else dict(rtol=2e-3, atol=1e-3)
        np.testing.assert_allclose(ours, their_out, **tol)
        exact = _exact_attention(q, k, v, m)
        np.testing.assert_allclose(np.asarray(ours, np.float64), exact, atol=2e-3)
    with pytest.raises(ValueError, match=r"`mask` must have shape \(q_seq, kv_seq\)"):
        _attention.dot_product_attention_weights(q, k, mask.T)


def test_float_mask_in_attention_as_equinox(monkeypatch):
    monkeypatch.setattr(_attention, "_warned_float_mask", [])
    ours = bnn.MultiheadAttention(2, 4, key=jr.key(0))
    theirs = eqx.nn.MultiheadAttention(2, 4, key=jr.key(0))
    q, kv = _normal(0, 3, 4), _normal(1, 5, 4)
    mask = (jnp.arange(15).reshape(3, 5) % 3 != 0).astype(jnp.float32)
    with pytest.warns(UserWarning, match="read as `mask != 0`"):
        out, their_out = _both(ours, theirs, q, kv, kv, mask)
    np.testing.assert_allclose(out, their_out, rtol=1e-5, atol=1e-6)


def test_complex_conv_as_equinox():
    theirs = eqx.nn.Conv2d(2, 3, 3, padding=1, dtype=jnp.complex64, key=jr.key(0))
    ours = bnn.Conv2d(2, 3, 3, padding=1, dtype=jnp.complex64, key=jr.key(0))
    assert ours.weight.dtype == theirs.weight.dtype == jnp.complex64
    ours = eqx.tree_at(lambda c: (c.weight, c.bias), ours, (theirs.weight, theirs.bias))
    x = (1 + 2j) * _normal(0, 2, 5, 5).astype(jnp.complex64)
    np.testing.assert_allclose(*_both(ours, theirs, x), rtol=1e-5, atol=1e-5)


def test_negative_embedding_index_as_equinox():
    weight = jnp.arange(12.0).reshape(4, 3)
    ours, theirs = bnn.Embedding(weight=weight), eqx.nn.Embedding(weight=weight)
    for i in (-1, -4, 0, 3):
        np.testing.assert_array_equal(ours(jnp.array(i)), theirs(jnp.array(i)))


@pytest.mark.parametrize(
    "make",
    [
        lambda nn: nn.AvgPool1d(2, 3),
        lambda nn: nn.AvgPool2d((1, 3), 2),
        lambda nn: nn.AdaptiveAvgPool2d((2, 3)),
    ],
)
def test_average_pools_of_integers_as_equinox(make):
    x = jnp.arange(42).reshape(1, 6, 7)
    x = x[:, 0] if isinstance(make(bnn), bnn.AvgPool1d) else x
    ours, theirs = _both(make(bnn), make(eqx.nn), x)
    assert ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize(
    "target, spatial", [(4, (14,)), ((2, 3), (3, 4)), ((2, 1, 3), (3, 2, 3))]
)
@pytest.mark.parametrize("kind", ["Avg", "Max"])
def test_adaptive_pool_numbers_as_equinox(target, spatial, kind):
    n = len(spatial)
    name = f"Adaptive{kind}Pool{n}d"
    x = _normal(3, 2, *spatial)
    ours, theirs = _both(getattr(bnn, name)(target), getattr(eqx.nn, name)(target), x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_prelu_of_integers_as_equinox():
    x = jnp.array([[-1, -2, 3]])
    for alpha in (0.1, jnp.array([0.2, 0.1, 0.3])):
        ours, theirs = _both(bnn.PReLU(alpha), eqx.nn.PReLU(alpha), x)
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)


def test_rope_dtype_promotion_as_equinox():
    x = _normal(0, 8, 4).astype(jnp.float16)
    ours = bnn.RotaryPositionalEmbedding(4, dtype=jnp.float32)
    theirs = eqx.nn.RotaryPositionalEmbedding(4, dtype=jnp.float32)
    with jax.numpy_dtype_promotion("strict"):
        for layer in (ours, theirs):
            with pytest.raises(jax.dtypes.TypePromotionError):
                layer(x)
    with jax.numpy_dtype_promotion("standard"):
        np.testing.assert_array_equal(*_both(ours, theirs, x))
