"""`boxwood.nn` pooling: values, ceil mode, defaults, dtypes, transformations, errors.

Parity with PyTorch (outputs and gradients) is in test_torch_parity_conv.py.
"""

import re

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.nn as nn

# One compilation per call signature (eager execution compiles every op).
_call = jax.jit(lambda layer, x: layer(x))


def _row(*values, dtype=jnp.float32):
    return jnp.asarray([values], dtype)


def test_default_stride_is_one_as_in_equinox():
    layer = nn.MaxPool2d(2)
    assert layer.stride == (1, 1) and layer.padding == ((0, 0), (0, 0))
    out = _call(layer, jnp.arange(16.0).reshape(1, 4, 4))
    np.testing.assert_array_equal(out[0], [[5, 6, 7], [9, 10, 11], [13, 14, 15]])


@pytest.mark.parametrize(
    "layer, x, expected",
    [
        # ceil mode keeps a partial last window, clipped to the padded input...
        (nn.AvgPool1d(3, 2, 1, use_ceil=True), _row(0, 1, 2, 3, 4), [1 / 3, 2, 7 / 3]),
        # ... but drops one that would start in the right padding.
        (nn.AvgPool1d(2, 2, 1, use_ceil=True), _row(0, 1, 2, 3, 4), [0, 1.5, 3.5]),
        (nn.AvgPool1d(2, 2, 1), _row(0, 1, 2, 3, 4), [0, 1.5, 3.5]),
        (nn.MaxPool1d(3, 2, 1, use_ceil=True), _row(0, 1, 2, 3, 4, 5), [1, 3, 5, 5]),
        (nn.MaxPool1d(3, 2, 1), _row(0, 1, 2, 3, 4, 5), [1, 3, 5]),
        # padding counts as zeros in the average (count_include_pad=True) ...
        (nn.AvgPool1d(2, 2, ((1, 0),)), _row(4, 4, 4), [2, 4]),
        # ... but never wins a maximum.
        (nn.MaxPool1d(2, 1, 1), _row(-3, -1, -2), [-3, -1, -1, -2]),
    ],
)
def test_known_values(layer, x, expected):
    np.testing.assert_allclose(_call(layer, x)[0], expected, rtol=1e-6)


def test_max_pool_of_integers():
    out = _call(nn.MaxPool1d(2, 2, 1), _row(-5, -7, 3, -1, dtype=jnp.int32))
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out[0], [-5, 3, -1])


def test_general_pool():
    layer = nn.Pool(jnp.array(0.0), lax.add, 1, 2, 2)
    assert layer.init == 0.0 and isinstance(layer.init, float)
    np.testing.assert_array_equal(_call(layer, _row(0, 1, 2, 3, 4, 5))[0], [1, 5, 9])


@pytest.mark.parametrize(
    "layer, x, expected",
    [
        # PyTorch's bins [0, 3), [2, 5), [4, 7): overlapping when 3 does not divide 7.
        (nn.AdaptiveAvgPool1d(3, bins="torch"), _row(0, 1, 2, 3, 4, 5, 6), [1, 3, 5]),
        # Equinox's bins [0, 3), [3, 5), [5, 7): disjoint, the wider first.
        (nn.AdaptiveAvgPool1d(3), _row(0, 1, 2, 3, 4, 5, 6), [1, 3.5, 5.5]),
        # More outputs than inputs: bins [0,1), [0,2), [1,2), [1,3), [2,3).
        (nn.AdaptiveMaxPool1d(5), _row(1, 2, 3), [1, 2, 2, 3, 3]),
        (nn.AdaptiveMaxPool1d((2,)), _row(1, 4, 2, 3), [4, 3]),
        (nn.AdaptivePool(2, 1, jnp.sum, bins="torch"), _row(1, 2, 3, 4, 5), [6, 12]),
        (nn.AdaptivePool(2, 1, jnp.sum), _row(1, 2, 3, 4, 5), [6, 9]),
    ],
)
def test_adaptive_known_values(layer, x, expected):
    np.testing.assert_allclose(_call(layer, x)[0], expected, rtol=1e-6)


def test_adaptive_global_average():
    x = jnp.arange(24.0).reshape(2, 3, 4)
    layer = nn.AdaptiveAvgPool2d(1)
    assert layer.target_shape == (1, 1)
    np.testing.assert_allclose(_call(layer, x), x.mean(axis=(1, 2), keepdims=True))


@pytest.mark.parametrize(
    "layer",
    [
        nn.MaxPool2d(3, 2, 1, use_ceil=True),
        nn.AvgPool2d(3, 2, 1, use_ceil=True),
        nn.AdaptiveAvgPool2d((3, 2)),
        nn.AdaptiveMaxPool2d(3),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_bfloat16_vmap_and_jit(layer):
    xs = jnp.asarray(
        np.random.default_rng(0).standard_normal((3, 2, 7, 6)), jnp.float32
    )
    batched = jax.jit(jax.vmap(_call, in_axes=(None, 0)))(layer, xs)
    looped = jnp.stack([_call(layer, x) for x in xs])
    np.testing.assert_allclose(batched, looped, rtol=0, atol=1e-6)
    np.testing.assert_allclose(layer(xs[0]), looped[0], rtol=0, atol=1e-6)  # eager
    low = _call(layer, xs[0].astype(jnp.bfloat16))
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(low.astype(jnp.float32), looped[0], rtol=0, atol=0.03)


def test_pools_have_no_leaves():
    layers = [
        nn.MaxPool3d(2),
        nn.AvgPool1d(2),
        nn.AdaptiveMaxPool3d(2),
        nn.Pool(0, lax.add, 1, 2),
    ]
    assert jax.tree_util.tree_leaves(layers) == []


@pytest.mark.parametrize(
    "layer, shape, message",
    [
        (nn.MaxPool2d(2), (4, 4),
         "MaxPool2d(kernel_size=(2, 2)): expected input of shape "
         "(channels, height, width), got (4, 4)."),
        (nn.AvgPool3d(2), (1, 4, 4),
         "AvgPool3d(kernel_size=(2, 2, 2)): expected input of shape "
         "(channels, depth, height, width), got (1, 4, 4)."),
        (nn.Pool(0, lax.add, 1, 2), (2, 3, 4),
         "Pool(num_spatial_dims=1, kernel_size=(2,)): expected input of shape "
         "(channels, length), got (2, 3, 4)."),
        (nn.AdaptiveAvgPool1d(2), (5,),
         "AdaptiveAvgPool1d(target_shape=(2,)): expected input of shape "
         "(channels, length), got (5,)."),
        (nn.AdaptivePool(2, 2, jnp.max), (1, 4),
         "AdaptivePool(num_spatial_dims=2, target_shape=(2, 2)): expected input of "
         "shape (channels, height, width), got (1, 4)."),
        (nn.MaxPool2d(5, padding=1), (1, 2, 3),
         "MaxPool2d(kernel_size=(5, 5)): the input's spatial shape (2, 3) padded to "
         "(4, 5) is smaller than the window (5, 5)"),
        (nn.AdaptiveMaxPool2d(2), (1, 0, 3),
         "AdaptiveMaxPool2d(target_shape=(2, 2)): cannot pool an input with an empty "
         "spatial axis, got shape (1, 0, 3)."),
    ],
)  # fmt: skip
def test_input_shape_errors(layer, shape, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        jax.eval_shape(layer, jnp.zeros(shape))


@pytest.mark.parametrize("layer", [nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(2)])
def test_average_of_integers_is_a_float_average(layer):
    # as Equinox: an integer input is averaged in the default float dtype
    out = layer(jnp.arange(4)[None])
    assert out.dtype == jnp.float32
    assert jnp.array_equal(out, layer(jnp.arange(4.0)[None]))


@pytest.mark.parametrize(
    "bins, expected",
    [("equinox", [1.5, 5.5, 9.0, 12.0]), ("torch", [1.5, 4.5, 8.5, 11.5])],
)
def test_adaptive_bins(bins, expected):
    # Equinox cuts 14 into disjoint bins of 4, 4, 3, 3; PyTorch into [0, 4), [3, 7),
    # [7, 11), [10, 14)
    out = nn.AdaptiveAvgPool1d(4, bins=bins)(jnp.arange(14.0)[None])
    assert out.tolist() == [expected]


def test_adaptive_bins_errors():
    with pytest.raises(ValueError, match="`bins` must be 'equinox' or 'torch'"):
        nn.AdaptiveMaxPool1d(2, bins="numpy")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: nn.MaxPool2d((2, 2, 2)), r"`kernel_size` must be an int or a sequence of 2 ints"),
        (lambda: nn.AvgPool1d(0), r"`kernel_size` must be >= 1 everywhere, got 0"),
        (lambda: nn.MaxPool1d(2, stride=0), r"`stride` must be >= 1 everywhere"),
        (lambda: nn.MaxPool1d(2, padding="SAME"), r"`padding` must be an int, a sequence of 1 ints"),
        (lambda: nn.AvgPool2d(2, padding=(1, -1)), r"`padding` must be non-negative"),
        (lambda: nn.MaxPool1d(2, padding=3), r"`padding` must be at most `kernel_size` on each side"),
        (lambda: nn.Pool(0, "add", 1, 2), r"`operation` must be callable, got 'add'"),
        (lambda: nn.Pool(0, lax.add, 0, 2), r"`num_spatial_dims` must be an int >= 1, got 0"),
        (lambda: nn.AdaptiveAvgPool2d(0), r"`target_shape` must be >= 1 everywhere"),
        (lambda: nn.AdaptiveMaxPool3d((2, 2)), r"`target_shape` must be an int or a sequence of 3 ints"),
        (lambda: nn.AdaptivePool(2, 1, None), r"`operation` must be callable, got None"),
    ],
)  # fmt: skip
def test_constructor_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("backend", ["tpu", "cpu"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_max_pool_gradient_leaves_two_axes_outside_the_windows(
    dims, backend, monkeypatch
):
    # A TPU differentiates a maximum over windows (select-and-scatter) only when
    # two axes of the operand are outside every window; a lone example of
    # `(channels, *spatial)` has one, so there the pool adds a leading unit axis
    # (not on a CPU, where it slowed a batched pool's gradient)
    from boxwood.nn import _pool

    monkeypatch.setattr(_pool.jax, "default_backend", lambda: backend)
    pool = [nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d][dims - 1](2, 1)
    x = jnp.arange(3.0 * 4**dims).reshape(3, *(4,) * dims) % 5
    jaxpr = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(pool(x) ** 2)))(x)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "reduce_window_max"]
    windows, strides = eqn.params["window_dimensions"], eqn.params["window_strides"]
    outside = [w == s == 1 for w, s in zip(windows, strides)]
    assert outside == [True] * (2 if backend == "tpu" else 1) + [False] * dims
    expected = lax.reduce_window(
        x, -jnp.inf, lax.max, (1,) + (2,) * dims, (1,) * (dims + 1), "VALID"
    )
    np.testing.assert_array_equal(pool(x), expected)
