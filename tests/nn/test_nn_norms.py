import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _precision import highest_matmul_precision, on_cpu, reduction_atol  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

# Layer calls whose values are checked: one compiled program per call signature
# (eagerly, each of the layer's operations compiles one of its own). Eager calls
# are kept where eager is what a test checks (`test_vmap_and_jit`,
# `test_layernorm_groupnorm_match_mean_var_formula`, `test_state_passthrough`).
_call = jax.jit(lambda layer, x: layer(x))


def test_layernorm_values(getkey):
    norm = nn.LayerNorm((2, 3))
    assert norm.weight.shape == norm.bias.shape == (2, 3)
    np.testing.assert_array_equal(norm.weight, 1.0)
    np.testing.assert_array_equal(norm.bias, 0.0)
    x = np.asarray(jr.normal(getkey(), (2, 3))) * 4 + 1
    y = np.asarray(_call(norm, x))
    assert abs(float(y.mean())) < 1e-5
    assert abs(float(y.var()) - 1) < 1e-3
    norm = nn.LayerNorm(3, use_weight=False, use_bias=False)
    assert norm.weight is None and norm.bias is None
    x = np.array([1.0, 2.0, 6.0], np.float32)
    expected = (x - 3.0) / np.sqrt(x.var() + 1e-5)
    np.testing.assert_allclose(_call(norm, x), expected, rtol=1e-6)


def test_layernorm_affine(getkey):
    norm = nn.LayerNorm(4)
    weight = jr.normal(getkey(), (4,))
    bias = jr.normal(getkey(), (4,))
    norm = boxwood.tree_at(lambda n: (n.weight, n.bias), norm, (weight, bias))
    x = jr.normal(getkey(), (4,))
    plain = _call(nn.LayerNorm(4, use_weight=False, use_bias=False), x)
    np.testing.assert_allclose(
        _call(norm, x), np.asarray(plain) * weight + bias, rtol=1e-5, atol=1e-6
    )


def test_rmsnorm_values(getkey):
    # Equinox's default: a bias (initialised to zero).
    norm = nn.RMSNorm(3)
    assert norm.use_bias is True
    np.testing.assert_array_equal(norm.bias, jnp.zeros(3))
    x = np.array([1.0, -2.0, 2.0], np.float32)
    np.testing.assert_allclose(_call(norm, x), x / np.sqrt(3.0 + 1e-5), rtol=1e-6)
    no_bias = nn.RMSNorm(3, use_bias=False)
    assert no_bias.bias is None and no_bias.use_bias is False
    np.testing.assert_allclose(_call(no_bias, x), _call(norm, x), rtol=1e-6)


def test_layernorm_elementwise_affine_is_deprecated():
    with pytest.warns(
        DeprecationWarning, match="elementwise_affine=.... is deprecated"
    ):
        norm = nn.LayerNorm(3, elementwise_affine=False)
    assert norm.weight is None and norm.bias is None
    assert not norm.use_weight and not norm.use_bias
    with pytest.warns(DeprecationWarning, match="use_weight=...` and `use_bias"):
        norm = nn.LayerNorm(3, use_weight=False, elementwise_affine=True)
    assert norm.use_weight and norm.use_bias and norm.weight.shape == (3,)


def test_groupnorm_values(getkey):
    norm = nn.GroupNorm(2, 4)
    x = np.asarray(jr.normal(getkey(), (4, 5)))
    y = _call(norm, x)
    for g in range(2):
        group = x[2 * g : 2 * g + 2]
        expected = (group - group.mean()) / np.sqrt(group.var() + 1e-5)
        np.testing.assert_allclose(y[2 * g : 2 * g + 2], expected, rtol=1e-5, atol=1e-6)
    # channels may be omitted without affine parameters
    free = nn.GroupNorm(2, channelwise_affine=False)
    assert free.weight is None
    np.testing.assert_allclose(_call(free, x), y, rtol=1e-6)
    assert _call(free, np.ones((6,), np.float32)).shape == (6,)


def test_groupnorm_per_channel_affine(getkey):
    norm = nn.GroupNorm(1, 3)
    w = jnp.array([1.0, 2.0, 3.0])
    norm = boxwood.tree_at(lambda n: n.weight, norm, w)
    x = jr.normal(getkey(), (3, 2, 2))
    base = np.asarray(_call(nn.GroupNorm(1, 3, channelwise_affine=False), x))
    np.testing.assert_allclose(
        _call(norm, x), base * np.asarray(w)[:, None, None], rtol=1e-5
    )


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda dt: nn.LayerNorm((3, 4), dtype=dt), (3, 4)),
        (lambda dt: nn.RMSNorm(4, dtype=dt), (4,)),
        (lambda dt: nn.GroupNorm(2, 4, dtype=dt), (4, 3)),
    ],
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision(getkey, make, shape, dtype):
    norm = make(dtype)
    assert all(leaf.dtype == dtype for leaf in jax.tree_util.tree_leaves(norm))
    x = (np.asarray(jr.normal(getkey(), shape)) * 100 + 500).astype(dtype)
    y = _call(norm, x)
    assert y.dtype == dtype and np.isfinite(np.asarray(y)).all()
    # float32 statistics: matches the float32 computation to bf16/f16 precision
    ref = _call(make(jnp.float32), x.astype(np.float32))
    np.testing.assert_allclose(y.astype(jnp.float32), ref, atol=0.05)


def test_vmap_and_jit(getkey):
    xs = jr.normal(getkey(), (5, 2, 3))
    rms = nn.RMSNorm(3)
    ys = jax.vmap(jax.vmap(rms))(xs)  # normalise over the last axis only
    np.testing.assert_allclose(ys[1, 0], rms(xs[1, 0]), rtol=1e-5, atol=1e-6)
    norm = nn.LayerNorm((2, 3))
    ys = jax.jit(lambda n, xs: jax.vmap(n)(xs))(norm, xs)
    np.testing.assert_allclose(ys[3], norm(xs[3]), rtol=1e-5, atol=1e-6)
    gn = nn.GroupNorm(1, 2)
    ys = jax.jit(lambda n, xs: jax.vmap(n)(xs))(gn, xs)
    np.testing.assert_allclose(ys[3], gn(xs[3]), rtol=1e-5, atol=1e-6)


def test_static_config():
    norm = nn.LayerNorm(3, eps=1e-3)
    assert len(jax.tree_util.tree_leaves(norm)) == 2
    other = nn.LayerNorm(3, eps=1e-4)
    assert jax.tree_util.tree_structure(norm) != jax.tree_util.tree_structure(other)


def test_shape_errors():
    with pytest.raises(
        ValueError,
        match=r"LayerNorm\(shape=\(2, 3\)\): expected input of shape \(2, 3\), got \(3, 2\)",
    ):
        nn.LayerNorm((2, 3))(jnp.ones((3, 2)))
    with pytest.raises(
        ValueError,
        match=r"RMSNorm\(shape=\(4,\)\): expected input of shape \(4,\), got \(2, 4\)",
    ):
        nn.RMSNorm(4)(jnp.ones((2, 4)))
    with pytest.raises(
        ValueError,
        match=r"GroupNorm\(groups=2, channels=4\): expected input of shape "
        r"\(4, \*spatial\), got \(3, 5\)",
    ):
        nn.GroupNorm(2, 4)(jnp.ones((3, 5)))
    with pytest.raises(ValueError, match=r"GroupNorm.*got \(\)"):
        nn.GroupNorm(2, 4)(jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"channels divisible by 2, got \(3, 5\)"):
        nn.GroupNorm(2, channelwise_affine=False)(jnp.ones((3, 5)))


def test_construction_errors():
    with pytest.raises(ValueError, match=r"`groups=3` must divide `channels=4`"):
        nn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="`channels` must be given"):
        nn.GroupNorm(2)
    with pytest.raises(ValueError, match="`groups` must be a positive int"):
        nn.GroupNorm(0, 4)
    with pytest.raises(ValueError, match="`eps` must be a non-negative float"):
        nn.LayerNorm(3, eps=-1.0)
    with pytest.raises(ValueError, match="`shape` must not be negative"):
        nn.RMSNorm(-2)
    with pytest.raises(TypeError, match="`shape` must be an int or a sequence"):
        nn.LayerNorm("abc")


def test_state_passthrough():
    """`y, state = norm(x, state)`, as for BatchNorm (so the two are swappable)."""
    state = {"anything": jnp.ones(2)}
    cases = [
        (nn.LayerNorm(3), (3,)),
        (nn.RMSNorm(3), (3,)),
        (nn.GroupNorm(1, 3), (3, 2)),
    ]
    for norm, shape in cases:
        x = jnp.arange(float(np.prod(shape))).reshape(shape)
        y, out_state = norm(x, state)
        assert out_state is state
        np.testing.assert_array_equal(y, norm(x))


def _reference_standardise(y, eps, axis=None):
    mean = jnp.mean(y, axis=axis, keepdims=True)
    var = jnp.maximum(jnp.var(y, axis=axis, keepdims=True), 0.0)
    return (y - mean) * jax.lax.rsqrt(var + eps)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_layernorm_groupnorm_match_mean_var_formula(getkey, scale):
    x = jr.normal(getkey(), (6, 35)) * scale + 2.0
    ln = nn.LayerNorm((6, 35), use_weight=False, use_bias=False)
    gn = nn.GroupNorm(3, 6, channelwise_affine=False)
    # the references in one program (eagerly, an operation of theirs compiled each)
    want_ln, want_gn = jax.jit(
        lambda x: (
            _reference_standardise(x, 1e-5),
            _reference_standardise(x.reshape(3, -1), 1e-5, axis=1).reshape(6, 35),
        )
    )(x)
    # The same formula; XLA may order the reductions differently (last bits), and
    # another backend's order (a GPU's tree) moves the mean by a few ulps of the
    # data, which standardising divides by the spread `scale`.
    atol = 1e-6 if on_cpu() else 1e-6 + reduction_atol(2.0 + scale, scale)
    np.testing.assert_allclose(ln(x), want_ln, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(gn(x), want_gn, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(jax.jit(ln)(x), want_ln, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(jax.jit(gn)(x), want_gn, rtol=1e-5, atol=atol)


def test_layernorm_groupnorm_trace_lean(getkey):
    # One subtraction of the mean (`jnp.var` would centre a second time, which made
    # the compile of many unrolled blocks twice as long), and no nested `jit`.
    x = jr.normal(getkey(), (4, 6, 8))
    layer_norm = jax.vmap(jax.vmap(nn.LayerNorm(8)))
    group_norm = jax.vmap(nn.GroupNorm(2, 6, channelwise_affine=False))
    for norm in [layer_norm, group_norm]:
        jaxpr = jax.make_jaxpr(jax.grad(lambda x, norm=norm: norm(x).sum()))(x)
        names = [e.primitive.name for e in jaxpr.eqns]
        assert "jit" not in names and "pjit" not in names, names
        forward = jax.make_jaxpr(norm)(x)
        assert [e.primitive.name for e in forward.eqns].count("sub") == 1
