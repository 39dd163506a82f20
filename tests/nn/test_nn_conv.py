"""`boxwood.nn` convolutions: shapes, padding, transposition, init, dtypes, errors.

Parity with PyTorch (outputs and gradients) is in test_torch_parity_conv.py.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bx
import boxwood.nn as nn


def _rand(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _shell(make, key):
    """`make(key)` without running the random initialisation (no compilation), for
    tests that only need shapes or that set the parameters themselves."""
    return jax.eval_shape(make, key)


def _set(layer, weight, bias=None, dtype=jnp.float32):
    layer = bx.tree_at(lambda m: m.weight, layer, jnp.asarray(weight, dtype))
    if bias is not None:
        layer = bx.tree_at(lambda m: m.bias, layer, jnp.asarray(bias, dtype))
    return layer


# One compilation per call signature (eager execution compiles every op).
_call = jax.jit(lambda layer, x: layer(x))


def _transpose_weight(w, groups):
    """A Conv weight -> the weight of its exact linear transpose (see docstring)."""
    cout, cin_g, *k = w.shape
    w = w.reshape(groups, cout // groups, cin_g, *k).swapaxes(1, 2)
    w = w.reshape(cin_g * groups, cout // groups, *k)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


# --- shapes and padding -----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, in_shape, out_shape",
    [
        (dict(kernel_size=3, stride=2, padding=1), (9, 8), (5, 4)),
        (dict(kernel_size=(3, 2), padding="VALID"), (5, 5), (3, 4)),
        (dict(kernel_size=4, stride=3, padding="SAME"), (10, 9), (4, 3)),
        (dict(kernel_size=4, stride=3, padding="same_lower"), (10, 9), (4, 3)),
        (dict(kernel_size=3, padding=((0, 2), (1, 0)), dilation=2), (6, 6), (4, 3)),
    ],
)
def test_conv_output_shape(kwargs, in_shape, out_shape, getkey):
    layer = _shell(lambda k: nn.Conv2d(2, 5, **kwargs, key=k), getkey())
    out = jax.eval_shape(_call, layer, jnp.zeros((2, *in_shape)))
    assert out.shape == (5, *out_shape)


def test_same_and_same_lower_put_the_odd_padding_at_opposite_ends(getkey):
    x = jnp.arange(1.0, 5.0)[None]
    first = jnp.array([[[1.0, 0.0]]])  # picks the first element of each window
    make = lambda padding: _set(
        _shell(
            lambda k: nn.Conv1d(1, 1, 2, padding=padding, use_bias=False, key=k),
            getkey(),
        ),
        first,
    )
    np.testing.assert_array_equal(_call(make("SAME"), x)[0], [1, 2, 3, 4])
    np.testing.assert_array_equal(_call(make("SAME_LOWER"), x)[0], [0, 1, 2, 3])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("ZEROS", [0, 0, 1, 2, 3, 4, 0, 0]),
        ("reflect", [3, 2, 1, 2, 3, 4, 3, 2]),
        ("Replicate", [1, 1, 1, 2, 3, 4, 4, 4]),
        ("CIRCULAR", [3, 4, 1, 2, 3, 4, 1, 2]),
    ],
)
def test_padding_modes(mode, expected, getkey):
    # A 1-wide kernel of 1 with padding 2 returns the padded input itself.
    make = lambda k: nn.Conv1d(1, 1, 1, 1, 2, padding_mode=mode, use_bias=False, key=k)
    layer = _shell(make, getkey())
    assert layer.padding_mode == mode.upper()
    out = _call(_set(layer, [[[1.0]]]), jnp.arange(1.0, 5.0)[None])
    np.testing.assert_array_equal(out[0], expected)


def test_config_is_normalised_and_static(getkey):
    layer = _shell(
        lambda k: nn.Conv2d(2, 4, 3, stride=(2, 1), padding=1, key=k), getkey()
    )
    assert layer.kernel_size == (3, 3) and layer.stride == (2, 1)
    assert layer.padding == ((1, 1), (1, 1)) and layer.dilation == (1, 1)
    same = _shell(lambda k: nn.Conv1d(1, 1, 3, padding="same", key=k), getkey())
    assert same.padding == "SAME"
    leaves = jax.tree_util.tree_leaves(layer)
    assert [leaf.shape for leaf in leaves] == [(4, 2, 3, 3), (4, 1, 1)]
    other = _shell(lambda k: nn.Conv2d(2, 4, 3, stride=2, padding=1, key=k), getkey())
    assert jax.tree_util.tree_structure(other) != jax.tree_util.tree_structure(layer)


def test_conv_transpose_positional_order_follows_equinox(getkey):
    # 1d/2d/3d: (..., stride, output_padding, padding); general: (..., padding, ...)
    layer = _shell(lambda k: nn.ConvTranspose2d(2, 3, 3, 2, 1, key=k), getkey())
    assert layer.output_padding == (1, 1) and layer.padding == ((0, 0), (0, 0))
    general = _shell(lambda k: nn.ConvTranspose(2, 2, 3, 3, 2, 1, key=k), getkey())
    assert general.output_padding == (0, 0) and general.padding == ((1, 1), (1, 1))


@pytest.mark.parametrize(
    "kwargs, in_shape, out_shape",
    [
        (dict(kernel_size=3, stride=2, padding=1), (4, 5), (7, 9)),
        (dict(kernel_size=3, stride=2, padding=1, output_padding=1), (4, 5), (8, 10)),
        (dict(kernel_size=4, stride=3, padding="SAME"), (2, 3), (6, 9)),
        (
            dict(kernel_size=4, stride=3, padding="SAME", output_padding=2),
            (2, 3),
            (4, 7),
        ),
        (dict(kernel_size=(2, 3), padding="VALID", dilation=2), (3, 3), (5, 7)),
    ],
)
def test_conv_transpose_output_shape(kwargs, in_shape, out_shape, getkey):
    layer = _shell(lambda k: nn.ConvTranspose2d(2, 5, **kwargs, key=k), getkey())
    out = jax.eval_shape(_call, layer, jnp.zeros((2, *in_shape)))
    assert out.shape == (5, *out_shape)


# --- ConvTranspose is the transpose of Conv ------------------------------------------


@pytest.mark.parametrize(
    "kwargs, size, output_padding",
    [
        (dict(kernel_size=3, stride=2, padding=1, groups=1), 8, 1),
        (dict(kernel_size=4, stride=3, padding=((2, 1),), groups=2), 11, 1),
        (dict(kernel_size=3, stride=2, padding="SAME", dilation=2, groups=2), 9, 1),
        (dict(kernel_size=2, stride=3, padding="SAME_LOWER", groups=1), 7, 2),
        (
            dict(kernel_size=4, stride=2, padding="SAME", groups=2, padding_mode="CIRCULAR"),
            8,
            0,
        ),
        (
            dict(kernel_size=3, stride=3, padding="SAME_LOWER", dilation=2, groups=1,
                 padding_mode="CIRCULAR"),
            9,
            0,
        ),
    ],
)  # fmt: skip
def test_conv_transpose_is_the_linear_transpose_of_conv(
    kwargs, size, output_padding, getkey
):
    conv = _shell(lambda k: nn.Conv1d(2, 4, **kwargs, use_bias=False, key=k), getkey())
    conv = _set(conv, _rand(conv.weight.shape, 0))
    convt = _shell(
        lambda k: nn.ConvTranspose1d(
            4, 2, **kwargs, output_padding=output_padding, use_bias=False, key=k
        ),
        getkey(),
    )
    convt = _set(convt, _transpose_weight(conv.weight, kwargs["groups"]))
    x = _rand((2, size), 1)
    r = _rand(jax.eval_shape(conv, x).shape, 2)

    @jax.jit
    def both(conv, convt, x, r):
        return convt(r), jax.vjp(conv, x)[1](r)[0]

    transposed, vjp = both(conv, convt, x, r)
    np.testing.assert_allclose(transposed, vjp, rtol=0, atol=1e-5)


def test_matches_equinox_same_padding_and_circular(getkey):
    eqx = pytest.importorskip("equinox")
    x = _rand((2, 7, 6), 3)
    configs = [
        dict(kernel_size=(4, 3), stride=(2, 3), padding="SAME_LOWER", dilation=(1, 2)),
        dict(kernel_size=3, stride=2, padding="SAME", output_padding=1),
        dict(kernel_size=4, stride=2, padding="SAME_LOWER", padding_mode="CIRCULAR"),
    ]
    for i, kw in enumerate(configs):
        transpose = "output_padding" in kw or kw.get("padding_mode") == "CIRCULAR"
        ours_cls = nn.ConvTranspose if transpose else nn.Conv
        theirs_cls = eqx.nn.ConvTranspose if transpose else eqx.nn.Conv
        ours = _shell(lambda k, c=ours_cls, kw=kw: c(2, 2, 3, **kw, key=k), getkey())
        ours = _set(ours, _rand(ours.weight.shape, i), _rand(ours.bias.shape, i + 9))
        make = lambda k, c=theirs_cls, kw=kw: c(2, 2, 3, **kw, key=k)
        theirs = _shell(make, getkey())
        new = (ours.weight, ours.bias)
        theirs = eqx.tree_at(lambda m: (m.weight, m.bias), theirs, new)
        got, expected = _call(ours, x), _call(theirs, x)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5, err_msg=str(i))


# --- initialisation, dtypes, transformations ----------------------------------------


@pytest.mark.parametrize(
    "cls, torch_name, fan_in",
    [
        # fan_in = in_channels // groups * 9 = 2 * 9 for Conv, but
        # out_channels // groups * 9 = 32 * 9 for ConvTranspose (as in PyTorch).
        (nn.Conv2d, "Conv2d", 18),
        (nn.ConvTranspose2d, "ConvTranspose2d", 288),
    ],
)
def test_init_bounds_match_pytorch(cls, torch_name, fan_in, getkey):
    layer = cls(4, 64, 3, groups=2, key=getkey())
    bound = fan_in**-0.5
    assert layer.weight.shape == (64, 2, 3, 3) and layer.bias.shape == (64, 1, 1)
    weight, bias = np.asarray(layer.weight), np.asarray(layer.bias)
    for p in (weight, bias):
        assert 0.8 * bound < np.abs(p).max() <= bound  # fills U(-bound, bound)
    assert weight.std() == pytest.approx(bound / 3**0.5, rel=0.1)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tmod = getattr(torch.nn, torch_name)(4, 64, 3, groups=2)
    assert 0.8 * bound < float(tmod.weight.detach().abs().max()) <= bound


def test_no_bias(getkey):
    layer = _shell(
        lambda k: nn.ConvTranspose1d(2, 3, 3, use_bias=False, key=k), getkey()
    )
    assert layer.bias is None
    assert len(jax.tree_util.tree_leaves(layer)) == 1


@pytest.mark.parametrize(
    "cls, dtype",
    [
        (nn.Conv2d, jnp.bfloat16),
        (nn.ConvTranspose2d, jnp.bfloat16),
        (nn.Conv2d, jnp.float16),
    ],
)
def test_low_precision_forward(cls, dtype, getkey):
    make = lambda k: cls(3, 4, 3, stride=2, padding=1, dtype=dtype, key=k)
    layer = _shell(make, getkey())
    assert layer.weight.dtype == dtype and layer.bias.dtype == dtype
    w, b = _rand(layer.weight.shape, 1) / 5, _rand(layer.bias.shape, 2) / 5
    x = _rand((3, 6, 5), 4)
    out = _call(_set(layer, w, b, dtype), x.astype(dtype))
    assert out.dtype == dtype
    # The same parameters and input, rounded to `dtype`, computed in float32.
    as_f32 = _set(layer, w.astype(dtype), b.astype(dtype))
    expected = _call(as_f32, x.astype(dtype).astype(jnp.float32))
    np.testing.assert_allclose(out.astype(jnp.float32), expected, rtol=0, atol=0.03)


def test_mixed_dtypes_follow_jax_promotion(getkey):
    layer = _shell(lambda k: nn.ConvTranspose1d(2, 3, 3, key=k), getkey())
    layer = _set(layer, _rand(layer.weight.shape, 1), _rand(layer.bias.shape, 2))
    x = _rand((2, 5), 3).astype(jnp.bfloat16)
    with jax.numpy_dtype_promotion("standard"):
        out = _call(layer, x)
    assert out.dtype == jnp.float32
    expected = _call(layer, x.astype(jnp.float32))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


def test_default_dtype_is_float32(getkey):
    layer = _shell(lambda k: nn.Conv1d(1, 1, 1, key=k), getkey())
    assert layer.weight.dtype == jnp.float32


@pytest.mark.parametrize("cls", [nn.Conv2d, nn.ConvTranspose2d])
def test_vmap_and_jit(cls, getkey):
    layer = _shell(lambda k: cls(2, 3, 3, stride=2, padding=1, key=k), getkey())
    layer = _set(layer, _rand(layer.weight.shape, 1), _rand(layer.bias.shape, 2))
    xs = _rand((3, 2, 5, 6), 5)
    batched = jax.jit(jax.vmap(_call, in_axes=(None, 0)))(layer, xs)
    # `_call` is plain `jax.jit` with the layer as an argument: the configuration
    # is static, so no filtering is needed.
    looped = jnp.stack([_call(layer, x) for x in xs])
    np.testing.assert_allclose(batched, looped, rtol=0, atol=1e-5)
    eager = layer(xs[0])
    np.testing.assert_allclose(looped[0], eager, rtol=0, atol=1e-5)


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, shape, message",
    [
        (lambda k: nn.Conv2d(3, 4, 3, key=k), (4, 8, 8),
         "Conv2d(in_channels=3): expected input of shape (3, height, width), got (4, 8, 8)."),
        (lambda k: nn.Conv1d(2, 4, 3, key=k), (2, 3, 4),
         "Conv1d(in_channels=2): expected input of shape (2, length), got (2, 3, 4)."),
        (lambda k: nn.Conv(3, 2, 4, 1, key=k), (2, 5, 5),
         "Conv(num_spatial_dims=3, in_channels=2): expected input of shape "
         "(2, depth, height, width), got (2, 5, 5)."),
        (lambda k: nn.ConvTranspose3d(2, 4, 3, key=k), (3, 2, 2, 2),
         "ConvTranspose3d(in_channels=2): expected input of shape "
         "(2, depth, height, width), got (3, 2, 2, 2)."),
    ],
)  # fmt: skip
def test_wrong_input_shape(make, shape, message, getkey):
    layer = _shell(make, getkey())
    with pytest.raises(ValueError, match=re.escape(message)):
        jax.eval_shape(layer, jnp.zeros(shape))


def test_input_errors(getkey):
    layer = _shell(lambda k: nn.Conv2d(3, 4, 5, dtype=jnp.bfloat16, key=k), getkey())
    message = (
        r"Conv2d\(in_channels=3\): cannot combine an input of dtype float32 with the "
        r"layer's bfloat16 weight under strict dtype promotion; cast the input with "
        r"`x.astype\(jnp.bfloat16\)`."
    )
    with pytest.raises(TypeError, match=message):
        jax.eval_shape(_call, layer, jnp.zeros((3, 8, 8)))
    message = (
        r"spatial shape \(3, 4\) padded to \(3, 4\) is smaller than the window \(5, 5\)"
    )
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(_call, layer, jnp.zeros((3, 3, 4), jnp.bfloat16))
    convt = _shell(lambda k: nn.ConvTranspose1d(1, 1, 2, padding=5, key=k), getkey())
    message = (
        r"ConvTranspose1d\(in_channels=1\): input spatial shape \(2,\) gives an empty"
    )
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(_call, convt, jnp.zeros((1, 2)))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(in_channels=3, groups=2), ValueError, r"`groups` must divide `in_channels`, got in_channels=3"),
        (dict(out_channels=3, groups=2), ValueError, r"`groups` must divide `out_channels`, got out_channels=3"),
        (dict(groups=0), ValueError, r"`groups` must be an int >= 1, got 0"),
        (dict(in_channels=0), ValueError, r"`in_channels` must be an int >= 1"),
        (dict(kernel_size=(3, 3, 3)), ValueError, r"`kernel_size` must be an int or a sequence of 2 ints"),
        (dict(kernel_size=True), ValueError, r"`kernel_size` must be an int or a sequence"),
        (dict(stride=0), ValueError, r"`stride` must be >= 1 everywhere, got 0"),
        (dict(dilation=(1, 0)), ValueError, r"`dilation` must be >= 1 everywhere"),
        (dict(padding="FULL"), ValueError, r"`padding` must be a string \('SAME', 'SAME_LOWER', 'VALID'\)"),
        (dict(padding=-1), ValueError, r"`padding` must be non-negative, got -1"),
        (dict(padding=((1, 2), (3,))), ValueError, r"sequence of 2 \(low, high\) pairs"),
        (dict(padding_mode="mirror"), ValueError, r"`padding_mode` must be one of 'ZEROS', 'REFLECT'"),
        (dict(dtype=jnp.int32), ValueError, r"`dtype` must be a floating-point or complex dtype"),
    ],
)  # fmt: skip
def test_constructor_errors(kwargs, error, message, getkey):
    args = dict(in_channels=4, out_channels=4, kernel_size=3) | kwargs
    with pytest.raises(error, match=message):
        nn.Conv2d(**args, key=getkey())


def test_num_spatial_dims_error(getkey):
    with pytest.raises(ValueError, match=r"`num_spatial_dims` must be an int >= 1"):
        nn.Conv(0, 1, 1, 1, key=getkey())


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(stride=2, output_padding=2), ValueError,
         r"`output_padding` must be smaller than `stride` in every dimension"),
        (dict(output_padding=-1), ValueError, r"`output_padding` must be >= 0"),
        (dict(padding_mode="REFLECT"), NotImplementedError,
         r"ConvTranspose1d\(in_channels=2\): `padding_mode='REFLECT'` is not supported"),
        (dict(padding=1, padding_mode="circular"), NotImplementedError,
         r"`padding_mode='CIRCULAR'` needs `padding='SAME'` or 'SAME_LOWER'"),
        (dict(padding="SAME", stride=2, output_padding=1, padding_mode="circular"),
         NotImplementedError, r"and `output_padding=0`, got"),
    ],
)  # fmt: skip
def test_conv_transpose_constructor_errors(kwargs, error, message, getkey):
    with pytest.raises(error, match=message):
        nn.ConvTranspose1d(2, 2, 3, **kwargs, key=getkey())
