"""Which path attention takes: `jax.nn.dot_product_attention` when it serves, the
explicit softmax (dropout on the weights, float64, value heads of another width)
otherwise, with the same results either way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.nn as nn
from boxwood.nn import _attention


@pytest.fixture
def normal():
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


@pytest.fixture
def fused_calls(monkeypatch):
    """The keyword arguments of each `jax.nn.dot_product_attention` call."""
    calls = []
    original = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return calls


def _explicit(q, k, v, mask=None):
    return _attention.dot_product_attention_weights(q, k, mask) @ v


def test_function_is_fused_and_equals_explicit_softmax(fused_calls, normal):
    q, k, v = normal(3, 4), normal(5, 4), normal(5, 4)
    mask = jnp.arange(15).reshape(3, 5) % 3 != 1
    # both paths in one compiled program per mask structure (eagerly, each
    # operation would compile on its own): one trace without a mask, one with
    both = jax.jit(
        lambda q, k, v, m: (
            _attention.dot_product_attention(q, k, v, m),
            _explicit(q, k, v, m),
        )
    )
    for m in (None, mask, mask.at[1].set(False)):  # (a fully masked row)
        np.testing.assert_allclose(*both(q, k, v, m), atol=1e-6)
    assert [c["implementation"] for c in fused_calls] == [None] * 2


def test_fully_masked_row_averages_values_as_equinox(normal):
    eqx = pytest.importorskip("equinox")
    q, k, v = normal(2, 4), normal(3, 4), normal(3, 4)
    mask = jnp.array([[True, False, True], [False, False, False]])
    ours, theirs = jax.jit(
        lambda *a: (
            _attention.dot_product_attention(*a),
            eqx.nn._attention.dot_product_attention(*a),
        )
    )(q, k, v, mask)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_allclose(ours[1], v.mean(axis=0), atol=1e-6)


def test_explicit_path_for_other_value_sizes_and_float64(fused_calls, normal):
    q, k, v = normal(3, 4), normal(5, 4), normal(5, 6)
    out = _attention.dot_product_attention(q, k, v)
    assert out.shape == (3, 6)
    np.testing.assert_allclose(out, _explicit(q, k, v), atol=1e-6)
    with jax.enable_x64(True):
        q64, k64 = (jnp.asarray(np.asarray(a), jnp.float64) for a in (q, k))
        out64 = _attention.dot_product_attention(q64, k64, k64)
        assert out64.dtype == jnp.float64
        want = np.asarray(_explicit(q64, k64, k64))
    np.testing.assert_allclose(np.asarray(out64), want, rtol=1e-13)
    assert fused_calls == []


def test_dropout_uses_explicit_path_unless_inference(fused_calls, normal):
    q, k, v = normal(3, 4), normal(5, 4), normal(5, 4)
    dropout = nn.Dropout(0.5)
    key = jax.random.key(0)
    out = _attention.dot_product_attention(q, k, v, dropout=dropout, key=key)
    weights = dropout(_attention.dot_product_attention_weights(q, k), key=key)
    np.testing.assert_allclose(out, weights @ v, atol=1e-6)
    assert fused_calls == []
    clean = _attention.dot_product_attention(q, k, v, dropout=dropout, inference=True)
    np.testing.assert_allclose(clean, _explicit(q, k, v), atol=1e-6)
    assert len(fused_calls) == 1
    with pytest.raises(RuntimeError, match="needs a random key"):
        _attention.dot_product_attention(q, k, v, dropout=dropout)


def test_implementation_is_passed_through(fused_calls, normal):
    q, k, v = normal(3, 4), normal(5, 4), normal(5, 4)
    out = _attention.dot_product_attention(q, k, v, implementation="xla")
    np.testing.assert_allclose(out, _explicit(q, k, v), atol=1e-6)
    assert fused_calls[-1]["implementation"] == "xla"
    if jax.default_backend() == "cpu":
        with pytest.raises(Exception, match="(?i)cudnn"):
            _attention.dot_product_attention(q, k, v, implementation="cudnn")
        assert fused_calls[-1]["implementation"] == "cudnn"


def test_implementation_with_active_dropout_is_an_error(normal):
    q = normal(3, 4)
    with pytest.raises(
        ValueError, match=r"`implementation='xla'`.*`dropout` is active"
    ):
        _attention.dot_product_attention(
            q,
            q,
            q,
            dropout=nn.Dropout(0.1),
            key=jax.random.key(0),
            implementation="xla",
        )


def test_mask_shape_error_names_the_function(normal):
    q = normal(3, 4)
    with pytest.raises(
        ValueError, match=r"dot_product_attention: `mask` must have shape .*\(3, 3\)"
    ):
        _attention.dot_product_attention(q, q, q, jnp.ones((3, 2), bool))


@pytest.mark.parametrize("per_head", [False, True])
def test_multihead_fused_matches_explicit(fused_calls, normal, per_head):
    mha = nn.MultiheadAttention(2, 4, dropout_p=0.5, key=jax.random.key(0))
    q, kv = normal(3, 4), normal(5, 4)
    shape = (2, 3, 5) if per_head else (3, 5)
    mask = jnp.asarray(np.random.default_rng(1).random(shape) > 0.4)

    @jax.jit  # one program (eagerly, each operation compiles one of its own)
    def fused_and_explicit(q, kv):
        fused = mha(q, kv, kv, mask, inference=True)
        # the same heads through the explicit softmax (dropout with p=0 weights)
        heads = [mha._split_heads(p, x) for p, x in ((mha.query_proj, q),
                 (mha.key_proj, kv), (mha.value_proj, kv))]  # fmt: skip
        explicit = _attention._attend(*heads, mask, drop=lambda w: w)
        return fused, jax.vmap(mha.output_proj)(explicit.reshape(3, -1))

    fused, want = fused_and_explicit(q, kv)
    assert len(fused_calls) == 1
    np.testing.assert_allclose(fused, want, atol=1e-6)
    loss = lambda m: m(q, kv, kv, mask, inference=True).sum()
    grad_fused = jax.jit(jax.grad(loss))(mha)
    assert np.all(np.isfinite(grad_fused.query_proj.weight))


def test_multihead_paths_under_vmap_and_jit(fused_calls, normal):
    mha = nn.MultiheadAttention(2, 4, key=jax.random.key(0))
    xs = normal(3, 5, 4)
    ys = jax.jit(jax.vmap(lambda x: mha(x, x, x)))(xs)
    np.testing.assert_allclose(ys[2], mha(xs[2], xs[2], xs[2]), atol=1e-5)
    assert fused_calls


def test_multihead_other_head_widths_match_equinox(fused_calls, normal):
    eqx = pytest.importorskip("equinox")
    kwargs = dict(qk_size=3, vo_size=5, use_query_bias=True)
    ours = nn.MultiheadAttention(2, 4, **kwargs, key=jax.random.key(0))
    theirs = eqx.nn.MultiheadAttention(2, 4, **kwargs, key=jax.random.key(0))
    q, kv = normal(3, 4), normal(6, 4)
    mask = jnp.arange(18).reshape(3, 6) % 4 != 0
    both = eqx.filter_jit(lambda a, b: (a(q, kv, kv, mask), b(q, kv, kv, mask)))
    np.testing.assert_allclose(*both(ours, theirs), atol=1e-6)
    assert fused_calls == []
