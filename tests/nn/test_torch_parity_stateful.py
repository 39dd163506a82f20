"""PyTorch parity: BatchNorm (train steps and eval), MultiheadAttention, GRU/LSTM cells.

Weights are copied from the torch layer into the boxwood layer; outputs, running
statistics and input gradients must agree to float32 precision.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _precision import highest_matmul_precision  # noqa: F401

torch = pytest.importorskip("torch")

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


ATOL = 1e-5


def to_jax(t):
    return jnp.asarray(t.detach().numpy())


def to_torch(a):
    return torch.tensor(np.asarray(a), requires_grad=True)


def value_and_vjp(f, cot, *args):
    """`(f(*args), vjp(cot))`, compiled as one program (quicker than eager)."""

    def run(cot, *args):
        out, vjp = jax.vjp(f, *args)
        return out, vjp(cot)

    return jax.jit(run)(cot, *args)


def close(a, b, atol=ATOL):
    if isinstance(b, torch.Tensor):
        b = b.detach().numpy()
    np.testing.assert_allclose(np.asarray(a), b, atol=atol, rtol=1e-5)


# ----------------------------------------------------------------------------- BatchNorm


@pytest.mark.parametrize(
    "shape, torch_cls",
    [
        ((6, 3), "BatchNorm1d"),
        ((5, 3, 4), "BatchNorm1d"),
        ((4, 3, 2, 3), "BatchNorm2d"),
    ],
)
@pytest.mark.parametrize("momentum", [0.9, 0.99])
def test_batch_norm_train_steps_then_eval(shape, torch_cls, momentum):
    rng = np.random.default_rng(0)
    channels = shape[1]
    tbn = getattr(torch.nn, torch_cls)(channels, eps=1e-5, momentum=1 - momentum)
    with torch.no_grad():
        tbn.weight.copy_(torch.tensor(rng.normal(size=channels), dtype=torch.float32))
        tbn.bias.copy_(torch.tensor(rng.normal(size=channels), dtype=torch.float32))
    bn, state = nn.make_with_state(nn.BatchNorm)(channels, "batch", momentum=momentum)
    bn = boxwood.tree_at(
        lambda m: (m.weight, m.bias), bn, (to_jax(tbn.weight), to_jax(tbn.bias))
    )

    def forward(x, state, inference=None):
        call = lambda x, s: bn(x, s, inference=inference)
        return jax.vmap(call, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
            x, state
        )

    @jax.jit
    def train_step(x, state, cot):
        (y, new_state), vjp = jax.vjp(lambda x: forward(x, state), x)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, new_state)
        return y, new_state, vjp((cot, zeros))[0]

    for step in range(3):
        x = (rng.normal(size=shape) * (step + 1) + step).astype(np.float32)
        cot = rng.normal(size=shape).astype(np.float32)
        tx = to_torch(x)
        ty = tbn(tx)
        ty.backward(torch.tensor(cot))
        y, state, gx = train_step(jnp.asarray(x), state, jnp.asarray(cot))
        close(y, ty)
        close(gx, tx.grad)
        running_mean, running_var = state.get(bn.state_index)
        close(running_mean, tbn.running_mean)
        close(running_var, tbn.running_var)

    tbn.eval()
    x = rng.normal(size=shape).astype(np.float32)
    close(forward(jnp.asarray(x), state, inference=True)[0], tbn(torch.tensor(x)))
    eval_bn = nn.inference_mode(bn)
    y, new_state = jax.vmap(
        eval_bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
    )(jnp.asarray(x), state)
    close(y, tbn(torch.tensor(x)))
    close(new_state.get(bn.state_index)[0], tbn.running_mean)  # unchanged in eval


def test_batch_norm_no_affine_matches_torch():
    rng = np.random.default_rng(1)
    tbn = torch.nn.BatchNorm1d(4, affine=False, momentum=0.1)
    bn, state = nn.make_with_state(nn.BatchNorm)(
        4, "b", channelwise_affine=False, momentum=0.9
    )
    x = rng.normal(size=(8, 4)).astype(np.float32)
    batched = jax.vmap(bn, axis_name="b", in_axes=(0, None), out_axes=(0, None))
    y, state = batched(jnp.asarray(x), state)
    close(y, tbn(torch.tensor(x)))
    close(state.get(bn.state_index)[1], tbn.running_var)


# ---------------------------------------------------------------------- MultiheadAttention


def _copy_mha(mha, tmha, bias):
    """Copy torch's projections into a boxwood MultiheadAttention (same layout)."""
    if tmha._qkv_same_embed_dim:
        in_weights = torch.chunk(tmha.in_proj_weight, 3)
    else:
        in_weights = (tmha.q_proj_weight, tmha.k_proj_weight, tmha.v_proj_weight)
    weights = [to_jax(w) for w in (*in_weights, tmha.out_proj.weight)]
    projs = lambda m: (m.query_proj, m.key_proj, m.value_proj, m.output_proj)
    mha = boxwood.tree_at(lambda m: tuple(p.weight for p in projs(m)), mha, weights)
    if bias:
        in_biases = torch.chunk(tmha.in_proj_bias, 3)
        biases = [to_jax(b) for b in (*in_biases, tmha.out_proj.bias)]
        mha = boxwood.tree_at(lambda m: tuple(p.bias for p in projs(m)), mha, biases)
    return mha


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "shared", "per_head"])
@pytest.mark.parametrize("kv_sizes", [(None, None), (6, 5)])
def test_multihead_attention(getkey, bias, mask_kind, kv_sizes):
    rng = np.random.default_rng(2)
    embed, heads, q_len, kv_len = 8, 2, 3, 5
    key_size, value_size = kv_sizes
    tmha = torch.nn.MultiheadAttention(
        embed, heads, bias=bias, batch_first=True, kdim=key_size, vdim=value_size
    )
    key_size = key_size or embed
    value_size = value_size or embed
    mha = nn.MultiheadAttention(
        heads,
        embed,
        key_size,
        value_size,
        use_query_bias=bias,
        use_key_bias=bias,
        use_value_bias=bias,
        use_output_bias=bias,
        key=getkey(),
    )
    mha = _copy_mha(mha, tmha, bias)

    q = rng.normal(size=(q_len, embed)).astype(np.float32)
    k = rng.normal(size=(kv_len, key_size)).astype(np.float32)
    v = rng.normal(size=(kv_len, value_size)).astype(np.float32)
    cot = rng.normal(size=(q_len, embed)).astype(np.float32)
    mask = None
    torch_mask = None
    if mask_kind != "none":
        shape = (q_len, kv_len) if mask_kind == "shared" else (heads, q_len, kv_len)
        mask = rng.random(shape) > 0.4
        mask[..., 0] = True  # no fully-masked rows (torch gives NaN there)
        torch_mask = torch.tensor(~mask)  # torch: True = masked out
    tq, tk, tv = (to_torch(a[None]) for a in (q, k, v))
    ty, _ = tmha(tq, tk, tv, attn_mask=torch_mask, need_weights=False)
    ty.backward(torch.tensor(cot[None]))

    jmask = None if mask is None else jnp.asarray(mask)
    y, grads = value_and_vjp(
        lambda q, k, v: mha(q, k, v, jmask), jnp.asarray(cot), q, k, v
    )
    close(y, ty[0])
    for g, t in zip(grads, (tq, tk, tv)):
        close(g, t.grad[0])


# ----------------------------------------------------------------------------- GRU / LSTM


def _gru_from_torch(tcell, cell):
    h = cell.hidden_size
    b_ih, b_hh = tcell.bias_ih, tcell.bias_hh
    bias = torch.cat([b_ih[: 2 * h] + b_hh[: 2 * h], b_ih[2 * h :]])
    return boxwood.tree_at(
        lambda c: (c.weight_ih, c.weight_hh, c.bias, c.bias_n),
        cell,
        (
            to_jax(tcell.weight_ih),
            to_jax(tcell.weight_hh),
            to_jax(bias),
            to_jax(b_hh[2 * h :]),
        ),
    )


def _lstm_from_torch(tcell, cell):
    bias = tcell.bias_ih + tcell.bias_hh
    return boxwood.tree_at(
        lambda c: (c.weight_ih, c.weight_hh, c.bias),
        cell,
        (to_jax(tcell.weight_ih), to_jax(tcell.weight_hh), to_jax(bias)),
    )


def test_gru_cell(getkey):
    rng = np.random.default_rng(3)
    tcell = torch.nn.GRUCell(4, 5)
    cell = _gru_from_torch(tcell, nn.GRUCell(4, 5, key=getkey()))
    x = rng.normal(size=(4,)).astype(np.float32)
    h = rng.normal(size=(5,)).astype(np.float32)
    cot = rng.normal(size=(5,)).astype(np.float32)
    tx, th = to_torch(x[None]), to_torch(h[None])
    ty = tcell(tx, th)
    ty.backward(torch.tensor(cot[None]))
    y, (gx, gh) = value_and_vjp(cell, jnp.asarray(cot), x, h)
    close(y, ty[0])
    close(gx, tx.grad[0])
    close(gh, th.grad[0])


def test_lstm_cell(getkey):
    rng = np.random.default_rng(4)
    tcell = torch.nn.LSTMCell(4, 5)
    cell = _lstm_from_torch(tcell, nn.LSTMCell(4, 5, key=getkey()))
    x, h, c, ch, cc = (
        rng.normal(size=s).astype(np.float32) for s in [(4,), (5,), (5,), (5,), (5,)]
    )
    tx, th, tc = to_torch(x[None]), to_torch(h[None]), to_torch(c[None])
    th2, tc2 = tcell(tx, (th, tc))
    (th2 * torch.tensor(ch[None]) + tc2 * torch.tensor(cc[None])).sum().backward()
    cot = (jnp.asarray(ch), jnp.asarray(cc))
    (h2, c2), (gx, gh, gc) = value_and_vjp(
        lambda x, h, c: cell(x, (h, c)), cot, x, h, c
    )
    close(h2, th2[0])
    close(c2, tc2[0])
    for g, t in [(gx, tx), (gh, th), (gc, tc)]:
        close(g, t.grad[0])


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_cells_scanned_match_torch_sequence_layers(getkey, kind):
    rng = np.random.default_rng(5)
    tlayer = getattr(torch.nn, kind)(3, 4, batch_first=True)
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    tcell = getattr(torch.nn, kind + "Cell")(3, 4)
    with torch.no_grad():
        for n in names:
            getattr(tcell, n).copy_(getattr(tlayer, n + "_l0"))
    if kind == "GRU":
        cell = _gru_from_torch(tcell, nn.GRUCell(3, 4, key=getkey()))
        h0 = jnp.zeros(4)
    else:
        cell = _lstm_from_torch(tcell, nn.LSTMCell(3, 4, key=getkey()))
        h0 = (jnp.zeros(4), jnp.zeros(4))
    xs = rng.normal(size=(6, 3)).astype(np.float32)
    touts, _ = tlayer(torch.tensor(xs[None]))

    def step(h, x):
        h = cell(x, h)
        return h, h if kind == "GRU" else h[0]

    _, outs = jax.lax.scan(step, h0, jnp.asarray(xs))
    close(outs, touts[0])
