"""PyTorch parity for convolutions and pooling: outputs and input gradients.

Weights are copied from `torch.nn` modules into `boxwood.nn` layers; both are run on
the same random float32 input, and the gradients of `sum(out * r)` (random `r`) with
respect to the input are compared too. All comparisons use `atol=1e-5` (small
shapes: at most a few hundred terms are accumulated per output).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bx
import boxwood.nn as nn

torch = pytest.importorskip("torch")
F = torch.nn.functional

ATOL = 1e-5


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@jax.jit
def _forward_and_grad(layers, x, rs):
    """Outputs and input-gradients of `sum(layer(x) * r)`, in one compilation."""
    outs = []
    for layer, r in zip(layers, rs):
        y, vjp = jax.vjp(layer, x)
        outs.append((y, vjp(r)[0]))
    return outs


def _assert_parity(layer, torch_fn, x, seed=0, *more):
    """Compare outputs and input-gradients of boxwood layers and torch functions.

    `more` holds further `(layer, torch_fn)` pairs run on the same input.
    """
    pairs = [(layer, torch_fn), *more]
    expected, rs = [], []
    for i, (_, fn) in enumerate(pairs):
        xt = torch.tensor(x[None], requires_grad=True)
        yt = fn(xt)[0]
        rs.append(_rand(tuple(yt.shape), seed + 1 + i))
        (yt * torch.tensor(rs[-1])).sum().backward()
        expected.append((yt.detach().numpy(), xt.grad[0].numpy()))

    layers = [layer for layer, _ in pairs]
    got = _forward_and_grad(layers, jnp.asarray(x), [jnp.asarray(r) for r in rs])
    for (y, gx), (yt, gxt) in zip(got, expected):
        assert y.shape == yt.shape
        np.testing.assert_allclose(np.asarray(y), yt, rtol=0, atol=ATOL)
        np.testing.assert_allclose(np.asarray(gx), gxt, rtol=0, atol=ATOL)


def _shell(make, key):
    """The layer `make(key)` would build, without running its (random)
    initialisation: the parity tests overwrite the parameters with torch's anyway."""
    return jax.eval_shape(make, key)


def _copy_conv(layer, tmod):
    """Conv: torch's weight layout is boxwood's; the bias gains trailing unit axes."""
    w = jnp.asarray(tmod.weight.detach().numpy())
    if tmod.bias is None:
        return bx.tree_at(lambda m: m.weight, layer, w)
    b = tmod.bias.detach().numpy().reshape(layer.bias.shape)
    return bx.tree_at(lambda m: (m.weight, m.bias), layer, (w, jnp.asarray(b)))


def _copy_conv_transpose(layer, tmod, groups):
    """ConvTranspose: the conversion documented on `boxwood.nn.ConvTranspose`."""
    wt = tmod.weight.detach().numpy()  # (in, out // groups, *kernel)
    cin, cout_g, *k = wt.shape
    w = wt.reshape(groups, cin // groups, cout_g, *k).swapaxes(1, 2)
    w = w.reshape(cout_g * groups, cin // groups, *k)
    w = np.flip(w, axis=tuple(range(2, w.ndim)))
    b = tmod.bias.detach().numpy().reshape(layer.bias.shape)
    new = (jnp.asarray(w.copy()), jnp.asarray(b))
    return bx.tree_at(lambda m: (m.weight, m.bias), layer, new)


_CONV = {
    1: (nn.Conv1d, torch.nn.Conv1d),
    2: (nn.Conv2d, torch.nn.Conv2d),
    3: (nn.Conv3d, torch.nn.Conv3d),
}

# (dims, in, out, kernel, stride, padding, dilation, groups, torch mode, spatial)
CONV_CASES = [
    (1, 3, 4, 3, 1, 0, 1, 1, "zeros", (9,)),
    (1, 4, 6, 3, 2, 1, 2, 2, "reflect", (11,)),
    (1, 2, 4, 4, 3, 2, 1, 2, "replicate", (10,)),
    (1, 3, 3, 2, 1, 3, 2, 3, "circular", (8,)),
    (2, 3, 4, (3, 2), (2, 1), (1, 0), (1, 2), 1, "zeros", (9, 8)),
    (2, 4, 6, 3, 1, (2, 1), (2, 1), 2, "reflect", (8, 9)),
    (2, 2, 4, (2, 3), (1, 2), 1, 1, 2, "replicate", (7, 6)),
    (2, 4, 4, 3, 2, 1, 1, 4, "circular", (6, 7)),
    (3, 2, 3, 3, (1, 2, 1), 1, 1, 1, "zeros", (5, 6, 5)),
    (3, 4, 4, (2, 3, 2), 1, (1, 1, 0), (2, 1, 1), 2, "reflect", (5, 5, 4)),
    (3, 2, 4, 2, 2, 1, 1, 2, "replicate", (5, 4, 5)),
    (3, 3, 3, 3, 1, 1, (1, 2, 1), 3, "circular", (4, 6, 4)),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}d-{c[8]}-g{c[7]}")
def test_conv(case, getkey):
    dims, cin, cout, k, s, p, d, g, mode, spatial = case
    ours, theirs = _CONV[dims]
    tmod = theirs(
        cin, cout, k, stride=s, padding=p, dilation=d, groups=g, padding_mode=mode
    )
    layer = _shell(
        lambda key: ours(cin, cout, k, s, p, d, g, padding_mode=mode, key=key),
        getkey(),
    )
    _assert_parity(_copy_conv(layer, tmod), tmod, _rand((cin, *spatial), dims))


# torch warns that it copies the input for even kernels with padding="same".
@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("dims, mode", [(1, "zeros"), (2, "reflect"), (3, "circular")])
def test_conv_same_padding(dims, mode, getkey):
    # Even kernels and dilation: the odd extra padding goes at the end in both.
    ours, theirs = _CONV[dims]
    k, d = (4, 3, 2)[:dims], (1, 2, 1)[:dims]
    tmod = theirs(2, 3, k, padding="same", dilation=d, padding_mode=mode)
    layer = _shell(
        lambda key: ours(
            2, 3, k, padding="SAME", dilation=d, padding_mode=mode, key=key
        ),
        getkey(),
    )
    _assert_parity(_copy_conv(layer, tmod), tmod, _rand((2, *(6, 5, 4)[:dims]), 7))


def test_conv_asymmetric_padding_no_bias(getkey):
    tmod = torch.nn.Conv2d(2, 3, (3, 2), stride=(2, 1), bias=False)
    pads = ((1, 2), (0, 3))
    layer = _shell(
        lambda key: nn.Conv2d(2, 3, (3, 2), (2, 1), pads, use_bias=False, key=key),
        getkey(),
    )
    assert layer.bias is None
    torch_fn = lambda x: tmod(F.pad(x, (0, 3, 1, 2)))  # torch: last axis first
    _assert_parity(_copy_conv(layer, tmod), torch_fn, _rand((2, 7, 6), 3))


_CONVT = {
    1: (nn.ConvTranspose1d, torch.nn.ConvTranspose1d),
    2: (nn.ConvTranspose2d, torch.nn.ConvTranspose2d),
    3: (nn.ConvTranspose3d, torch.nn.ConvTranspose3d),
}

# (dims, in, out, kernel, stride, padding, output_padding, dilation, groups, spatial)
CONVT_CASES = [
    (1, 3, 4, 3, 2, 1, 1, 1, 1, (5,)),
    (1, 4, 6, 4, 3, 2, 2, 2, 2, (4,)),
    (1, 2, 2, 2, 1, 3, 0, 1, 1, (10,)),  # padding > dilation * (kernel - 1)
    (2, 3, 4, (3, 2), (2, 3), (1, 0), (1, 2), (1, 2), 1, (4, 5)),
    (2, 4, 6, 3, 2, 2, 0, 1, 2, (5, 4)),
    (2, 2, 4, (2, 3), 1, 0, 0, (2, 1), 2, (3, 4)),
    (3, 2, 3, (2, 3, 2), (2, 1, 2), (0, 1, 1), (1, 0, 0), 1, 1, (3, 4, 3)),
    (3, 4, 4, 3, 1, 1, 0, (2, 1, 1), 4, (4, 3, 3)),
    (3, 2, 4, 2, 2, 1, 1, 1, 2, (3, 3, 2)),
]


@pytest.mark.parametrize("case", CONVT_CASES, ids=lambda c: f"{c[0]}d-s{c[4]}-g{c[8]}")
def test_conv_transpose(case, getkey):
    dims, cin, cout, k, s, p, op, d, g, spatial = case
    ours, theirs = _CONVT[dims]
    tmod = theirs(cin, cout, k, s, p, op, groups=g, dilation=d)
    kwargs = dict(padding=p, output_padding=op, dilation=d, groups=g)
    layer = _shell(lambda key: ours(cin, cout, k, s, **kwargs, key=key), getkey())
    layer = _copy_conv_transpose(layer, tmod, g)
    _assert_parity(layer, tmod, _rand((cin, *spatial), dims + 10))


_MAX = {
    1: (nn.MaxPool1d, F.max_pool1d),
    2: (nn.MaxPool2d, F.max_pool2d),
    3: (nn.MaxPool3d, F.max_pool3d),
}
_AVG = {
    1: (nn.AvgPool1d, F.avg_pool1d),
    2: (nn.AvgPool2d, F.avg_pool2d),
    3: (nn.AvgPool3d, F.avg_pool3d),
}

# (dims, kernel, stride, padding, ceil, spatial)
POOL_CASES = [
    (1, 3, 2, 1, False, (10,)),
    (1, 2, 2, 1, True, (5,)),  # ceil mode drops a window starting in the padding
    (1, 3, 2, 0, True, (8,)),
    (1, 4, 3, 2, True, (10,)),
    (2, (3, 2), (2, 1), (1, 0), False, (7, 6)),
    (2, 3, 2, 1, True, (6, 7)),
    (2, 2, (3, 2), (1, 1), True, (8, 5)),
    (3, 2, 2, 0, False, (4, 5, 4)),
    (3, (3, 2, 2), (2, 1, 2), (1, 0, 1), True, (5, 4, 5)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}d-ceil{c[4]}")
def test_max_and_avg_pool(case):
    dims, k, s, p, ceil, spatial = case
    (max_pool, torch_max), (avg_pool, torch_avg) = _MAX[dims], _AVG[dims]
    layer = max_pool(k, s, p, use_ceil=ceil)
    fn = lambda x: torch_max(x, k, s, p, ceil_mode=ceil)
    avg = (
        avg_pool(k, s, p, use_ceil=ceil),
        lambda x: torch_avg(x, k, s, p, ceil_mode=ceil),
    )
    _assert_parity(layer, fn, _rand((3, *spatial), dims + 20), 0, avg)


_ADAPTIVE = {
    1: (
        (nn.AdaptiveMaxPool1d, F.adaptive_max_pool1d),
        (nn.AdaptiveAvgPool1d, F.adaptive_avg_pool1d),
    ),
    2: (
        (nn.AdaptiveMaxPool2d, F.adaptive_max_pool2d),
        (nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d),
    ),
    3: (
        (nn.AdaptiveMaxPool3d, F.adaptive_max_pool3d),
        (nn.AdaptiveAvgPool3d, F.adaptive_avg_pool3d),
    ),
}

# (dims, target shape, spatial): divisible, non-divisible and upsampling sizes.
ADAPTIVE_CASES = [
    (1, 2, (8,)),
    (1, 3, (10,)),
    (1, 4, (7,)),
    (1, 5, (3,)),
    (2, (3, 4), (7, 9)),
    (2, (2, 2), (6, 8)),
    (2, (5, 3), (4, 7)),
    (3, (2, 3, 2), (5, 7, 3)),
    (3, 2, (4, 4, 4)),
]


@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=lambda c: f"{c[0]}d-{c[1]}-{c[2]}")
def test_adaptive_max_and_avg_pool(case):
    dims, target, spatial = case
    (max_pool, torch_max), (avg_pool, torch_avg) = _ADAPTIVE[dims]
    avg = (avg_pool(target, bins="torch"), lambda x: torch_avg(x, target))
    x = _rand((2, *spatial), dims + 30)
    layer = max_pool(target, bins="torch")
    _assert_parity(layer, lambda x: torch_max(x, target), x, 0, avg)
