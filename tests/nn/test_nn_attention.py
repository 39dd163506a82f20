import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _precision import highest_matmul_precision  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


@pytest.fixture
def normal():
    """`normal(*shape)`: standard normal float32 inputs (NumPy-generated, so that
    tests do not compile a random-number kernel per shape)."""
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


# Layer calls whose values are compared: compiled as one program per call
# signature (eagerly, each of the layer's operations compiles one of its own).
_call = jax.jit(lambda layer, *args: layer(*args))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference(mha, q, k, v, mask=None):
    """NumPy, one head at a time: softmax(q_h k_h^T / sqrt(d)) v_h, concatenated,
    projected."""
    f64 = lambda a: np.asarray(a, np.float64)
    qh = (f64(q) @ f64(mha.query_proj.weight).T).reshape(q.shape[0], mha.num_heads, -1)
    kh = (f64(k) @ f64(mha.key_proj.weight).T).reshape(k.shape[0], mha.num_heads, -1)
    vh = (f64(v) @ f64(mha.value_proj.weight).T).reshape(v.shape[0], mha.num_heads, -1)
    outs = []
    for h in range(mha.num_heads):
        logits = qh[:, h] @ kh[:, h].T / math.sqrt(mha.qk_size)
        if mask is not None:
            m = np.asarray(mask if mask.ndim == 2 else mask[h])
            logits = np.where(m, logits, -np.inf)
        outs.append(softmax(logits) @ vh[:, h])
    return np.concatenate(outs, axis=-1) @ f64(mha.output_proj.weight).T


def test_default_sizes_and_init(getkey):
    mha = nn.MultiheadAttention(4, 16, key=getkey())
    assert (mha.key_size, mha.value_size, mha.output_size) == (16, 16, 16)
    assert (mha.qk_size, mha.vo_size) == (4, 4)
    assert mha.query_proj.bias is None and mha.output_proj.bias is None
    bound = 1 / math.sqrt(16)
    assert float(jnp.max(jnp.abs(mha.query_proj.weight))) <= bound
    assert float(jnp.max(jnp.abs(mha.query_proj.weight))) > 0.8 * bound


def test_custom_sizes_match_reference(getkey, normal):
    mha = nn.MultiheadAttention(
        3,
        5,
        key_size=6,
        value_size=7,
        output_size=2,
        qk_size=4,
        vo_size=3,
        key=getkey(),
    )
    assert mha.query_proj.weight.shape == (12, 5)
    assert mha.value_proj.weight.shape == (9, 7)
    assert mha.output_proj.weight.shape == (2, 9)
    q, k, v = (
        normal(4, 5),
        normal(6, 6),
        normal(6, 7),
    )
    y = _call(mha, q, k, v)
    assert y.shape == (4, 2)
    np.testing.assert_allclose(y, reference(mha, q, k, v), atol=1e-5)


@pytest.mark.parametrize("per_head", [False, True])
def test_mask(getkey, per_head, normal):
    mha = nn.MultiheadAttention(2, 4, key=getkey())
    q, k = normal(3, 4), normal(5, 4)
    shape = (2, 3, 5) if per_head else (3, 5)
    mask = np.random.default_rng(1).random(shape) > 0.5
    mask[..., 0] = True
    mask = jnp.asarray(mask)
    y = _call(mha, q, k, k, mask)
    np.testing.assert_allclose(y, reference(mha, q, k, k, mask), atol=1e-5)
    # Masked-out values do not matter.
    if not per_head:
        k2 = np.where(np.asarray(mask).any(axis=0)[:, None], k, np.float32(100.0))
        np.testing.assert_allclose(_call(mha, q, k, k2, mask), y, atol=1e-5)


def test_causal_mask_ignores_future(getkey, normal):
    mha = nn.MultiheadAttention(2, 4, key=getkey())
    x = normal(5, 4)
    causal = np.tril(np.ones((5, 5), bool))
    y = _call(mha, x, x, x, causal)
    x2 = np.asarray(x).copy()
    x2[4] = 10.0
    np.testing.assert_allclose(_call(mha, x2, x2, x2, causal)[:4], y[:4], atol=1e-5)


def test_process_heads(getkey, normal):
    mha = nn.MultiheadAttention(2, 4, key=getkey())
    x = normal(3, 4)
    seen = {}

    def double_values(q, k, v):
        seen["shapes"] = (q.shape, k.shape, v.shape)
        return q, k, 2 * v

    y = mha(x, x, x, process_heads=double_values)
    assert seen["shapes"] == ((3, 2, 2), (3, 2, 2), (3, 2, 2))
    np.testing.assert_allclose(y, 2 * mha(x, x, x), atol=1e-5)
    with pytest.raises(ValueError, match="`process_heads` must return"):
        mha(x, x, x, process_heads=lambda q, k, v: (q[:1], k, v))


def test_dropout_needs_key_and_inference_switches_it_off(getkey, normal):
    mha = nn.MultiheadAttention(2, 4, dropout_p=0.5, key=getkey())
    x = normal(3, 4)
    with pytest.raises(RuntimeError, match="needs a random key"):
        mha(x, x, x)
    y1 = mha(x, x, x, key=getkey())
    y2 = mha(x, x, x, key=getkey())
    assert not np.allclose(y1, y2)
    clean = mha(x, x, x, inference=True)
    np.testing.assert_allclose(nn.inference_mode(mha)(x, x, x), clean, atol=1e-6)
    plain = nn.MultiheadAttention(2, 4, key=getkey())
    plain = boxwood.tree_at(
        lambda m: (m.query_proj, m.key_proj, m.value_proj, m.output_proj),
        plain,
        (mha.query_proj, mha.key_proj, mha.value_proj, mha.output_proj),
    )
    np.testing.assert_allclose(clean, plain(x, x, x), atol=1e-6)


def test_vmap_jit_grad(getkey, normal):
    mha = nn.MultiheadAttention(2, 4, use_query_bias=True, key=getkey())
    xs = normal(3, 5, 4)
    ys = jax.jit(jax.vmap(lambda x: mha(x, x, x)))(xs)
    assert ys.shape == (3, 5, 4)
    np.testing.assert_allclose(ys[1], mha(xs[1], xs[1], xs[1]), atol=1e-5)
    # (the gradient jitted too: eagerly each backward operation compiles alone)
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m(xs[0], xs[0], xs[0]))))(mha)
    assert grads.query_proj.bias.shape == (4,)


def test_bf16_forward(getkey, normal):
    mha = nn.MultiheadAttention(2, 4, dtype=jnp.bfloat16, key=getkey())
    assert mha.key_proj.weight.dtype == jnp.bfloat16
    x = normal(3, 4)
    low = x.astype(jnp.bfloat16)
    y = _call(mha, low, low, low)
    assert y.dtype == jnp.bfloat16
    m32 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), mha)
    np.testing.assert_allclose(y.astype(jnp.float32), _call(m32, x, x, x), atol=0.05)


@pytest.mark.parametrize(
    "shapes, match",
    [
        (
            ((3, 5), (4, 4), (4, 4)),
            r"expected query of shape \(q_seq, 4\), got \(3, 5\)",
        ),
        (
            ((3, 4), (4, 3), (4, 4)),
            r"expected key of shape \(kv_seq, 4\), got \(4, 3\)",
        ),
        (((3, 4), (4, 4), (5, 4)), r"expected value of shape \(4, 4\), got \(5, 4\)"),
        (((4,), (4, 4), (4, 4)), r"expected query of shape \(q_seq, 4\), got \(4,\)"),
    ],
)
def test_shape_errors(getkey, shapes, match):
    mha = nn.MultiheadAttention(2, 4, key=getkey())
    args = [jnp.ones(s) for s in shapes]
    with pytest.raises(
        ValueError, match=r"MultiheadAttention\(num_heads=2, query_size=4\): " + match
    ):
        mha(*args)


def test_mask_errors(getkey):
    mha = nn.MultiheadAttention(2, 4, key=getkey())
    q, k = jnp.ones((3, 4)), jnp.ones((5, 4))
    with pytest.raises(
        ValueError, match=r"expected mask of shape \(3, 5\), got \(5, 3\)"
    ):
        mha(q, k, k, jnp.ones((5, 3), bool))
    with pytest.raises(
        ValueError, match=r"expected mask of shape \(2, 3, 5\), got \(3, 3, 5\)"
    ):
        mha(q, k, k, jnp.ones((3, 3, 5), bool))


def test_float_mask_read_as_equinox_reads_it(getkey, monkeypatch):
    # Equinox accepts a float mask (nonzero = may attend); boxwood reads it the same
    # way and warns once, since an additive mask would be inverted.
    from boxwood.nn import _attention

    monkeypatch.setattr(_attention, "_warned_float_mask", [])
    mha = nn.MultiheadAttention(2, 4, key=getkey())
    q, k = jax.random.normal(getkey(), (3, 4)), jax.random.normal(getkey(), (5, 4))
    bool_mask = jnp.arange(15).reshape(3, 5) % 3 != 0
    with pytest.warns(UserWarning, match=r"`mask` has dtype float32.*`mask == 0`"):
        out = mha(q, k, k, bool_mask.astype(jnp.float32))
    assert jnp.array_equal(out, mha(q, k, k, bool_mask))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        mha(q, k, k, bool_mask.astype(jnp.float32))


def test_constructor_errors(getkey):
    with pytest.raises(ValueError, match="`num_heads` must be a positive int"):
        nn.MultiheadAttention(0, 4, key=getkey())
    with pytest.raises(ValueError, match="`qk_size` and `vo_size` must be positive"):
        nn.MultiheadAttention(8, 4, key=getkey())


def test_deterministic_is_the_deprecated_spelling_of_inference(getkey, normal):
    mha = nn.MultiheadAttention(2, 4, dropout_p=0.5, key=getkey())
    x = normal(3, 4)
    with pytest.warns(DeprecationWarning, match=r"MultiheadAttention\(\)\(\.\.\., det"):
        y = mha(x, x, x, deterministic=True)  # no key needed: no dropout
    np.testing.assert_allclose(y, mha(x, x, x, inference=True), atol=1e-6)


def test_float16_heads_are_fused_on_a_gpu_only(monkeypatch):
    """`jax.nn.dot_product_attention`'s float16 products sum in float32, which
    the CPU's and a TPU's XLA refuse (seen on a v5e): there float16 heads take
    the explicit weights; bfloat16 heads stay fused everywhere."""
    from boxwood._kernels import fusable

    half, brain = (
        jnp.ones((1, 2, 1, 8), jnp.float16),
        jnp.ones((1, 2, 1, 8), jnp.bfloat16),
    )
    for backend, fused in (("cpu", False), ("tpu", False), ("gpu", True)):
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        assert fusable(half, half, half) is fused, backend
        assert fusable(brain, brain, brain), backend


def test_float16_attention_compiles_on_every_backend(getkey):
    """float16 heads under `filter_jit`: on the CPU and a TPU, whose XLA has no
    float16 product summed in float32, the weights are formed explicitly instead
    of through `jax.nn.dot_product_attention`, and the result is the eager call's."""
    mha = nn.MultiheadAttention(2, 8, dtype=jnp.float16, key=getkey())
    x = jax.random.normal(getkey(), (3, 8)).astype(jnp.float16)
    compiled = boxwood.filter_jit(lambda m, x: m(x, x, x))(mha, x)
    assert compiled.dtype == jnp.float16
    np.testing.assert_allclose(
        np.asarray(compiled, np.float32),
        np.asarray(mha(x, x, x), np.float32),
        rtol=2e-3,
        atol=2e-3,
    )
