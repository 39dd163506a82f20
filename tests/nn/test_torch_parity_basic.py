"""Parity of the basic layers with PyTorch: same weights in, same outputs and the same
input gradients out (float32, atol 1e-5)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn

torch = pytest.importorskip("torch")

ATOL = 1e-5


def to_jax(t):
    return jnp.asarray(t.detach().cpu().numpy())


def copy_params(layer, torch_module, names):
    """`layer` with the fields `names` (boxwood name -> torch name) copied from torch."""
    where = lambda m: tuple(getattr(m, n) for n in names)
    values = tuple(to_jax(getattr(torch_module, names[n])) for n in names)
    return boxwood.tree_at(where, layer, values)


def randomise(torch_module, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in torch_module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return torch_module


@boxwood.filter_jit
def _forward_and_grad(layer, x, cot, batched):
    """The output and the input-gradient for `cot`, in one program (eager, each
    operation would compile a program of its own for each shape)."""
    y, vjp = jax.vjp(jax.vmap(layer) if batched else layer, x)
    return y, vjp(cot)[0]


def compare(layer, torch_module, x_np, *, batched=True):
    """Outputs and input-gradients (for a random cotangent) of both frameworks."""
    x_t = torch.tensor(x_np, requires_grad=True)
    y_t = torch_module(x_t)
    cot = np.random.default_rng(1).standard_normal(y_t.shape).astype(np.float32)
    y_t.backward(torch.tensor(cot))
    y, gx = _forward_and_grad(layer, jnp.asarray(x_np), jnp.asarray(cot), batched)
    np.testing.assert_allclose(y, y_t.detach().numpy(), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(gx, x_t.grad.numpy(), atol=ATOL, rtol=1e-5)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(getkey, bias):
    t = torch.nn.Linear(5, 4, bias=bias)
    names = {"weight": "weight", "bias": "bias"} if bias else {"weight": "weight"}
    layer = copy_params(nn.Linear(5, 4, use_bias=bias, key=getkey()), t, names)
    compare(layer, t, rand(6, 5))


def test_linear_init_matches_torch_bounds(getkey):
    layer = nn.Linear(32, 64, key=getkey())
    t = torch.nn.Linear(32, 64)
    bound = 1 / math.sqrt(32)
    for ours, theirs in [(layer.weight, t.weight), (layer.bias, t.bias)]:
        theirs = theirs.detach().numpy()
        assert np.abs(theirs).max() <= bound and float(jnp.abs(ours).max()) <= bound
    # Same distribution: both U(-bound, bound), std bound/sqrt(3).
    expected = bound / math.sqrt(3)
    assert abs(float(layer.weight.std()) - expected) < 0.1 * expected
    assert abs(float(t.weight.detach().std()) - expected) < 0.1 * expected


@pytest.mark.parametrize("shape", [(7,), (3, 4)])
@pytest.mark.parametrize("affine", ["both", "weight_only", "none"])
def test_layernorm(shape, affine):
    t = torch.nn.LayerNorm(
        shape, elementwise_affine=affine != "none", bias=affine == "both"
    )
    randomise(t)
    layer = nn.LayerNorm(shape, use_weight=affine != "none", use_bias=affine == "both")
    names = {"weight": "weight", "bias": "bias"}
    names = {k: v for k, v in names.items() if getattr(layer, k) is not None}
    layer = copy_params(layer, t, names) if names else layer
    compare(layer, t, rand(5, *shape) * 3 + 1)


@pytest.mark.parametrize("shape", [(6,), (2, 3)])
@pytest.mark.parametrize("use_weight", [True, False])
def test_rmsnorm(shape, use_weight):
    # torch's default eps=None means finfo(float32).eps; pass the same eps to both.
    t = randomise(torch.nn.RMSNorm(shape, eps=1e-5, elementwise_affine=use_weight))
    layer = nn.RMSNorm(shape, eps=1e-5, use_weight=use_weight, use_bias=False)
    if use_weight:
        layer = copy_params(layer, t, {"weight": "weight"})
    compare(layer, t, rand(4, *shape) * 2)


@pytest.mark.parametrize("spatial", [(), (5,), (3, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_groupnorm(spatial, affine):
    t = randomise(torch.nn.GroupNorm(3, 6, affine=affine))
    layer = nn.GroupNorm(3, 6, channelwise_affine=affine)
    if affine:
        layer = copy_params(layer, t, {"weight": "weight", "bias": "bias"})
    compare(layer, t, rand(2, 6, *spatial) + 0.5)


def test_embedding(getkey):
    t = torch.nn.Embedding(10, 4)
    layer = copy_params(nn.Embedding(10, 4, key=getkey()), t, {"weight": "weight"})
    idx = np.array([3, 0, 9, 3], dtype=np.int64)
    y_t = t(torch.tensor(idx))
    cot = rand(4, 4, seed=2)
    y_t.backward(torch.tensor(cot))
    y, vjp = jax.vjp(lambda m: jax.vmap(m)(jnp.asarray(idx, jnp.int32)), layer)
    (grads,) = vjp(jnp.asarray(cot))
    np.testing.assert_allclose(y, y_t.detach().numpy(), atol=ATOL)
    # Gradients with respect to the table (indices have none); row 3 accumulates twice.
    np.testing.assert_allclose(grads.weight, t.weight.grad.numpy(), atol=ATOL)


def test_embedding_init_is_standard_normal(getkey):
    ours = np.asarray(nn.Embedding(300, 40, key=getkey()).weight)
    torch.manual_seed(0)  # deterministic: an unseeded draw fails now and then
    theirs = torch.nn.Embedding(300, 40).weight.detach().numpy()
    # 12,000 draws: the std of the sample std is about 0.0065; 0.03 is ~4.6 of those
    for w in (ours, theirs):
        assert abs(w.mean()) < 0.03 and abs(w.std() - 1.0) < 0.03


def test_prelu_scalar():
    t = torch.nn.PReLU()
    layer = nn.PReLU()
    np.testing.assert_allclose(layer.negative_slope, t.weight.detach().numpy()[0])
    with torch.no_grad():
        t.weight.fill_(0.1)
    layer = nn.PReLU(0.1)
    compare(layer, t, rand(3, 4, 5), batched=False)


def test_prelu_per_channel():
    # torch's channel axis is axis 1 of a batch, i.e. axis 0 of one example of shape
    # (channels,); boxwood's slope broadcasts NumPy-style, so shape (channels,) here.
    t = randomise(torch.nn.PReLU(num_parameters=4))
    layer = nn.PReLU(to_jax(t.weight))
    compare(layer, t, rand(6, 4))
    # and the gradient with respect to the slopes
    x = rand(6, 4, seed=3)
    t.zero_grad()
    t(torch.tensor(x)).sum().backward()
    grads = jax.grad(lambda m: jax.vmap(m)(jnp.asarray(x)).sum())(layer)
    np.testing.assert_allclose(grads.negative_slope, t.weight.grad.numpy(), atol=1e-4)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9])
def test_dropout_scaling(getkey, p):
    """The random masks differ between frameworks (different generators), so the test
    compares what is defined: kept entries are x / (1 - p), the rest are zero, and
    the kept fraction is 1 - p."""
    x = np.abs(rand(20_000)) + 0.5
    t = torch.nn.Dropout(p).train()
    torch.manual_seed(0)
    y_t = t(torch.tensor(x)).numpy()
    y = np.asarray(nn.Dropout(p)(jnp.asarray(x), key=getkey()))
    for out in (y, y_t):
        kept = out != 0
        np.testing.assert_allclose(out[kept], x[kept] / (1 - p), rtol=1e-6)
        assert abs(kept.mean() - (1 - p)) < 0.02
    both = (y != 0) & (y_t != 0)
    np.testing.assert_allclose(y[both], y_t[both], rtol=1e-6)
    # eval mode: identity in both
    t.eval()
    np.testing.assert_array_equal(
        nn.Dropout(p, inference=True)(jnp.asarray(x)), t(torch.tensor(x)).numpy()
    )
