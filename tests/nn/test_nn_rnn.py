import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.nn as nn
from _precision import tolerance

# float32 against a float64 reference, or batched against unbatched: a TPU's
# sigmoid and tanh are a few ulps off and its products group sums differently
# (7e-6 measured on a v5e); the CPU keeps its 1e-6
F32_ATOL = tolerance(cpu=1e-6, accelerator=3e-5)


@pytest.fixture
def normal():
    """`normal(*shape)`: standard normal float32 inputs (NumPy-generated, so that
    tests do not compile a random-number kernel per shape)."""
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_gru_formula(getkey, normal):
    cell = nn.GRUCell(3, 2, key=getkey())
    x, h = normal(3), normal(2)
    # NumPy reference (float64), in PyTorch's notation.
    wi, wh, b, bn = (
        np.asarray(a, np.float64)
        for a in (cell.weight_ih, cell.weight_hh, cell.bias, cell.bias_n)
    )
    xn, hn = np.asarray(x, np.float64), np.asarray(h, np.float64)
    r = sigmoid(wi[:2] @ xn + b[:2] + wh[:2] @ hn)
    z = sigmoid(wi[2:4] @ xn + b[2:4] + wh[2:4] @ hn)
    n = np.tanh(wi[4:] @ xn + b[4:] + r * (wh[4:] @ hn + bn))
    np.testing.assert_allclose(cell(x, h), (1 - z) * n + z * hn, atol=F32_ATOL)


def test_lstm_formula(getkey, normal):
    cell = nn.LSTMCell(3, 2, key=getkey())
    x, h, c = normal(3), normal(2), normal(2)
    wi, wh, b = (
        np.asarray(a, np.float64) for a in (cell.weight_ih, cell.weight_hh, cell.bias)
    )
    gates = wi @ np.asarray(x, np.float64) + wh @ np.asarray(h, np.float64) + b
    i, f, g, o = gates[:2], gates[2:4], gates[4:6], gates[6:]
    c2 = sigmoid(f) * np.asarray(c, np.float64) + sigmoid(i) * np.tanh(g)
    h2, c2_ = cell(x, (h, c))
    np.testing.assert_allclose(c2_, c2, atol=F32_ATOL)
    np.testing.assert_allclose(h2, sigmoid(o) * np.tanh(c2), atol=F32_ATOL)


@pytest.mark.parametrize("cls, gates", [(nn.GRUCell, 3), (nn.LSTMCell, 4)])
def test_init_shapes_and_pytorch_bounds(getkey, cls, gates):
    cell = cls(6, 16, key=getkey())
    assert cell.weight_ih.shape == (gates * 16, 6)
    assert cell.weight_hh.shape == (gates * 16, 16)
    assert cell.bias.shape == (gates * 16,)
    bound = 1 / math.sqrt(16)
    for w in (cell.weight_ih, cell.weight_hh, cell.bias):
        assert float(jnp.max(jnp.abs(w))) <= bound
    assert float(jnp.max(jnp.abs(cell.weight_hh))) > 0.9 * bound


@pytest.mark.parametrize("cls", [nn.GRUCell, nn.LSTMCell])
def test_no_bias(getkey, cls):
    cell = cls(3, 2, use_bias=False, key=getkey())
    assert cell.bias is None
    assert len(jax.tree_util.tree_leaves(cell)) == 2
    hidden = jnp.zeros(2) if cls is nn.GRUCell else (jnp.zeros(2), jnp.zeros(2))
    # Without bias, a zero input and zero state stay at zero.
    out = cell(jnp.zeros(3), hidden)
    np.testing.assert_allclose(jax.tree_util.tree_leaves(out)[0], 0.0, atol=1e-7)


def test_scan_vmap_jit(getkey, normal):
    cell = nn.LSTMCell(3, 4, key=getkey())
    xs = normal(2, 5, 3)  # (batch, time, features)

    def run(xs):
        def step(hc, x):
            hc = cell(x, hc)
            return hc, hc[0]

        return jax.lax.scan(step, (jnp.zeros(4), jnp.zeros(4)), xs)[1]

    out = jax.jit(jax.vmap(run))(xs)
    assert out.shape == (2, 5, 4)
    np.testing.assert_allclose(out[1], run(xs[1]), atol=F32_ATOL)


@pytest.mark.parametrize("cls", [nn.GRUCell, nn.LSTMCell])
def test_a_batched_step_and_its_derivatives_need_no_transpose(getkey, cls):
    # the products put the input first (`nn.Linear`'s `weight_times`): with
    # `weight @ x` a GRU step's gradient took four transposes, an LSTM's two
    cell = cls(3, 4, key=getkey())
    xs = jax.random.normal(getkey(), (5, 3))
    hs = jax.random.normal(getkey(), (5, 4))
    state = hs if cls is nn.GRUCell else (hs, jnp.tanh(hs))

    def loss(cell, xs):
        out = jax.vmap(cell)(xs, state)
        return sum(jnp.sum(o**2) for o in jax.tree.leaves(out))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(cell, xs).jaxpr
    names = [e.primitive.name for e in jaxpr.eqns]
    assert names.count("dot_general") == 5 and "transpose" not in names, names
    # the same values as one example at a time
    one = cell(xs[1], jax.tree.map(lambda a: a[1], state))
    batched = jax.tree.map(lambda a: a[1], jax.vmap(cell)(xs, state))
    for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(one), strict=True):
        np.testing.assert_allclose(a, b, rtol=tolerance(cpu=1e-6, accelerator=1e-5))


def test_bf16_forward(getkey):
    dtype = jnp.bfloat16
    gru = nn.GRUCell(3, 2, dtype=dtype, key=getkey())
    lstm = nn.LSTMCell(3, 2, dtype=dtype, key=getkey())
    x, h = jnp.ones(3, dtype), jnp.zeros(2, dtype)
    assert gru(x, h).dtype == dtype
    assert all(a.dtype == dtype for a in lstm(x, (h, h)))


def test_gru_shape_errors(getkey):
    cell = nn.GRUCell(3, 2, key=getkey())
    name = r"GRUCell\(input_size=3, hidden_size=2\): "
    with pytest.raises(
        ValueError, match=name + r"expected input of shape \(3,\), got \(4,\)"
    ):
        cell(jnp.ones(4), jnp.ones(2))
    with pytest.raises(
        ValueError, match=name + r"expected hidden of shape \(2,\), got \(1, 2\)"
    ):
        cell(jnp.ones(3), jnp.ones((1, 2)))


def test_lstm_shape_errors(getkey):
    cell = nn.LSTMCell(3, 2, key=getkey())
    name = r"LSTMCell\(input_size=3, hidden_size=2\): "
    with pytest.raises(
        ValueError, match=name + r"`hidden` must be the pair `\(h, c\)`"
    ):
        cell(jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match=name + r"expected hidden h of shape \(2,\)"):
        cell(jnp.ones(3), (jnp.ones(3), jnp.ones(2)))
    with pytest.raises(
        ValueError, match=name + r"expected cell state c of shape \(2,\)"
    ):
        cell(jnp.ones(3), (jnp.ones(2), jnp.ones(5)))
    with pytest.raises(ValueError, match=name + r"expected input of shape \(3,\)"):
        cell(jnp.ones((3, 1)), (jnp.ones(2), jnp.ones(2)))


def test_bad_dtype(getkey):
    with pytest.raises(TypeError, match="GRUCell: `dtype` must be a floating-point"):
        nn.GRUCell(3, 2, dtype=jnp.int32, key=getkey())
