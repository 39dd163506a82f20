import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.nn as nn
from _precision import tolerance


@pytest.fixture
def normal():
    """`normal(*shape)`: standard normal float32 inputs (NumPy-generated, so that
    tests do not compile a random-number kernel per shape)."""
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


# One input shape for the tests where the shape is not the point: each eager
# operation compiles once per shape, so tests that share it share those programs.
SEQ, SIZE = 6, 8


def reference_rope(x, theta=10_000.0):
    """Hand-written RoPE, "rotate half" convention: channel j pairs with j + d/2."""
    x = np.asarray(x, np.float64)
    seq_len, d = x.shape
    out = np.empty_like(x)
    for t in range(seq_len):
        for j in range(d // 2):
            angle = t * theta ** (-2.0 * j / d)
            a, b = x[t, j], x[t, j + d // 2]
            out[t, j] = a * np.cos(angle) - b * np.sin(angle)
            out[t, j + d // 2] = b * np.cos(angle) + a * np.sin(angle)
    return out


@pytest.mark.parametrize("theta", [10_000.0, 100.0])
def test_matches_reference(getkey, theta, normal):
    rope = nn.RotaryPositionalEmbedding(SIZE, theta=theta)
    x = normal(SEQ, SIZE)
    np.testing.assert_allclose(rope(x), reference_rope(x, theta), atol=1e-5)


def test_matches_equinox_if_installed(getkey, normal):
    eqx = pytest.importorskip("equinox")
    x = normal(SEQ, SIZE)
    expected = eqx.nn.RotaryPositionalEmbedding(SIZE)(x)
    np.testing.assert_allclose(
        nn.RotaryPositionalEmbedding(SIZE)(x), expected, atol=1e-6
    )


def test_position_zero_unchanged_and_norms_preserved(getkey, normal):
    rope = nn.RotaryPositionalEmbedding(SIZE)
    x = normal(SEQ, SIZE)
    y = rope(x)
    np.testing.assert_allclose(y[0], x[0], atol=1e-6)
    np.testing.assert_allclose(
        jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5
    )


def test_dot_products_depend_on_relative_position(getkey, normal):
    rope = nn.RotaryPositionalEmbedding(8)
    q, k = normal(8), normal(8)
    # q at position m, k at position n, for (m, n) = (1, 0) and (5, 4).
    seq_q = jnp.zeros((6, 8)).at[1].set(q).at[5].set(q)
    seq_k = jnp.zeros((6, 8)).at[0].set(k).at[4].set(k)
    rq, rk = rope(seq_q), rope(seq_k)
    np.testing.assert_allclose(rq[1] @ rk[0], rq[5] @ rk[4], rtol=1e-4)
    assert not np.allclose(rq[1] @ rk[0], rq[5] @ rk[0], rtol=1e-3)


def test_with_attention_process_heads(getkey, normal):
    mha = nn.MultiheadAttention(2, 8, key=getkey())
    rope = nn.RotaryPositionalEmbedding(mha.qk_size)

    def process_heads(q, k, v):
        q = jax.vmap(rope, in_axes=1, out_axes=1)(q)
        k = jax.vmap(rope, in_axes=1, out_axes=1)(k)
        return q, k, v

    x = normal(SEQ, SIZE)
    y, plain = jax.jit(
        lambda x: (mha(x, x, x, process_heads=process_heads), mha(x, x, x))
    )(x)
    assert y.shape == (SEQ, SIZE)
    assert not np.allclose(y, plain, atol=1e-4)


def test_static_config_and_jit(getkey, normal):
    rope = nn.RotaryPositionalEmbedding(SIZE)
    assert jax.tree_util.tree_leaves(rope) == []
    x = normal(SEQ, SIZE)
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(rope, x), rope(x), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision(getkey, dtype, normal):
    x = normal(SEQ, SIZE)
    expected = reference_rope(x)
    y = nn.RotaryPositionalEmbedding(SIZE, dtype=dtype)(x.astype(dtype))
    assert y.dtype == dtype
    np.testing.assert_allclose(y.astype(jnp.float32), expected, atol=0.05)
    # A float32 table with a low-precision input works under standard promotion
    # and, as in Equinox, raises under strict promotion (the tests' setting).
    rope32 = nn.RotaryPositionalEmbedding(SIZE)
    with jax.numpy_dtype_promotion("standard"):
        y = rope32(x.astype(dtype))
    assert y.dtype == dtype
    with pytest.raises(
        jax.dtypes.TypePromotionError,
        match=rf"input's dtype {jnp.dtype(dtype).name} differs from the layer's "
        r"float32.*`dtype=jnp\.",
    ):
        rope32(x.astype(dtype))


def test_errors():
    with pytest.raises(ValueError, match="`embedding_size` must be even"):
        nn.RotaryPositionalEmbedding(5)
    with pytest.raises(ValueError, match="`embedding_size` must be even"):
        nn.RotaryPositionalEmbedding(-2)
    rope = nn.RotaryPositionalEmbedding(4)
    with pytest.raises(
        ValueError,
        match=r"RotaryPositionalEmbedding\(embedding_size=4\): expected input of shape "
        r"\(seq_len, 4\), got \(3, 6\)",
    ):
        rope(jnp.ones((3, 6)))
    with pytest.raises(ValueError, match=r"got \(4,\)"):
        rope(jnp.ones(4))


def test_rotate_half_and_precompute_freqs_cis(normal):
    rope = nn.RotaryPositionalEmbedding(SIZE, theta=50.0)
    x = normal(SEQ, SIZE)
    rotated = rope.rotate_half(x)
    np.testing.assert_array_equal(rotated[:, :4], -x[:, 4:])
    np.testing.assert_array_equal(rotated[:, 4:], x[:, :4])
    cos, sin = nn.RotaryPositionalEmbedding.precompute_freqs_cis(
        SIZE, SEQ, 50.0, jnp.float32
    )
    assert cos.shape == sin.shape == (6, 4) and cos.dtype == jnp.float32
    angles = np.arange(6)[:, None] * 50.0 ** (-np.arange(0, 8, 2) / 8)[None, :]
    # a TPU's float32 `pow` (the frequencies) is good to a few ulps, which the
    # positions multiply: 6e-6 off at position 5
    atol = tolerance(cpu=1e-6, accelerator=2e-5)
    np.testing.assert_allclose(cos, np.cos(angles), atol=atol)
    np.testing.assert_allclose(sin, np.sin(angles), atol=atol)
    # The layer is exactly `x * cos + rotate_half(x) * sin` with the tables tiled.
    manual = x * np.tile(cos, (1, 2)) + rotated * np.tile(sin, (1, 2))
    np.testing.assert_allclose(rope(x), manual, atol=1e-6)
    half = nn.RotaryPositionalEmbedding.precompute_freqs_cis(
        SIZE, SEQ, 50.0, jnp.bfloat16
    )
    assert half[0].dtype == jnp.bfloat16


def test_static_methods_match_equinox_if_installed(normal):
    eqx = pytest.importorskip("equinox")
    ours, theirs = nn.RotaryPositionalEmbedding, eqx.nn.RotaryPositionalEmbedding
    x = normal(SEQ, SIZE)
    np.testing.assert_array_equal(ours.rotate_half(x), theirs.rotate_half(x))
    for a, b in zip(
        ours.precompute_freqs_cis(SIZE, SEQ, 10_000.0, jnp.float32),
        theirs.precompute_freqs_cis(SIZE, SEQ, 10_000.0, jnp.float32),
    ):
        np.testing.assert_allclose(a, b, atol=1e-6)
