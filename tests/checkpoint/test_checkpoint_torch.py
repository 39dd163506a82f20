"""PyTorch weights, saved with `safetensors.torch.save_file`, load into the equivalent
boxwood model through `load_state_dict`: an MLP, a CNN with BatchNorm (running
statistics into `nn.State`), a GRU and multi-head attention give the same outputs.
These are the recipes of docs/checkpoints.md."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _precision import highest_matmul_precision  # noqa: F401

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


ATOL = 1e-5


def save_torch(module, path):
    """What a PyTorch user does: save the state dict as a safetensors file."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    safetensors_torch.save_file(module.state_dict(), path)
    return module


def test_mlp(tmp_path, getkey):
    net = torch.nn.Sequential(
        torch.nn.Linear(3, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 2),
    )
    save_torch(net, tmp_path / "mlp.safetensors")
    model = nn.MLP(3, 2, 16, 2, key=getkey())
    # torch numbers the ReLUs too: Linear i of the MLP is entry 2*i of the Sequential
    key_map = lambda k: "layers.{}.{}".format(
        int(k.split(".")[0]) // 2, k.split(".")[1]
    )
    model, report = boxwood.load_state_dict(
        model, tmp_path / "mlp.safetensors", key_map=key_map
    )
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_allclose(
        jax.vmap(model)(x), net(torch.tensor(x)).detach().numpy(), atol=ATOL
    )
    assert report.missing_keys == report.unexpected_keys == []


class TorchCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4, momentum=0.1)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))


class CNN(boxwood.Module):
    conv: nn.Conv2d
    bn: nn.BatchNorm
    pool: nn.MaxPool2d
    fc: nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.conv = nn.Conv2d(1, 4, 3, key=k1)
        self.bn = nn.BatchNorm(4, "batch", momentum=0.9)  # torch momentum 0.1
        self.pool = nn.MaxPool2d(2, 2)
        self.fc = nn.Linear(4 * 3 * 3, 5, key=k2)

    def __call__(self, x, state):
        y, state = self.bn(self.conv(x), state)
        return self.fc(self.pool(jax.nn.relu(y)).reshape(-1)), state


CNN_KEY_MAP = {
    "bn.running_mean": "1.CNN.bn.state_index.0",
    "bn.running_var": "1.CNN.bn.state_index.1",
    "bn.num_batches_tracked": None,  # boxwood's BatchNorm does not count batches
}


def prefixed(key_map):
    """The model is entry 0 of `(model, state)`: its keys get a `0.` prefix."""
    return lambda k: key_map[k] if k in key_map else "0." + k


def test_cnn_with_batch_norm_statistics_into_state(tmp_path, getkey):
    net = TorchCNN()
    x = np.random.default_rng(0).normal(size=(8, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        net.train()(torch.tensor(x) + 1.0)  # move the running statistics
    save_torch(net.conv, tmp_path / "unused.safetensors")  # randomise conv weights
    safetensors_torch.save_file(net.state_dict(), tmp_path / "cnn.safetensors")
    model, state = nn.make_with_state(CNN)(getkey())
    (model, state), _ = boxwood.load_state_dict(
        (model, state), tmp_path / "cnn.safetensors", key_map=prefixed(CNN_KEY_MAP)
    )
    mean, var = state.get(model.bn.state_index)
    np.testing.assert_allclose(mean, net.bn.running_mean.numpy())
    batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    # evaluation: the running statistics
    y, _ = jax.vmap(
        nn.inference_mode(model),
        axis_name="batch",
        in_axes=(0, None),
        out_axes=(0, None),
    )(x, state)
    np.testing.assert_allclose(
        y, net.eval()(torch.tensor(x)).detach().numpy(), atol=ATOL
    )
    # training: batch statistics, and the same updated running statistics
    y, state = batched(x, state)
    with torch.no_grad():
        want = net.train()(torch.tensor(x)).numpy()
    np.testing.assert_allclose(y, want, atol=ATOL)
    np.testing.assert_allclose(
        state.get(model.bn.state_index)[1], net.bn.running_var.numpy(), atol=ATOL
    )


def gru_state_dict(sd, prefix="cell."):
    """torch.nn.GRU's layer-0 weights as boxwood GRUCell fields: the input and hidden
    biases of the reset and update gates add up; the hidden bias of the new gate
    stays apart (`bias_n`)."""
    b_ih, b_hh = sd["bias_ih_l0"], sd["bias_hh_l0"]
    hidden = b_hh.shape[0] // 3
    return {
        prefix + "weight_ih": sd["weight_ih_l0"],
        prefix + "weight_hh": sd["weight_hh_l0"],
        prefix + "bias": b_ih
        + np.concatenate([b_hh[: 2 * hidden], np.zeros(hidden, b_hh.dtype)]),
        prefix + "bias_n": b_hh[2 * hidden :],
    }


class GRU(boxwood.Module):
    cell: nn.GRUCell

    def __call__(self, xs):
        h0 = jnp.zeros(self.cell.hidden_size)
        step = lambda h, x: (self.cell(x, h),) * 2
        return jax.lax.scan(step, h0, xs)[1]


def test_gru(tmp_path, getkey):
    net = save_torch(torch.nn.GRU(3, 6, batch_first=True), tmp_path / "gru.safetensors")
    sd = safetensors_numpy.load_file(tmp_path / "gru.safetensors")
    model, _ = boxwood.load_state_dict(
        GRU(nn.GRUCell(3, 6, key=getkey())), gru_state_dict(sd)
    )
    xs = np.random.default_rng(0).normal(size=(2, 7, 3)).astype(np.float32)
    np.testing.assert_allclose(
        jax.vmap(model)(xs), net(torch.tensor(xs))[0].detach().numpy(), atol=ATOL
    )


def attention_state_dict(sd, prefix=""):
    """torch.nn.MultiheadAttention's packed input projection, split into boxwood's
    query, key and value projections."""
    out = {
        prefix + "output_proj.weight": sd["out_proj.weight"],
        prefix + "output_proj.bias": sd["out_proj.bias"],
    }
    parts = zip(
        ("query", "key", "value"),
        np.split(sd["in_proj_weight"], 3),
        np.split(sd["in_proj_bias"], 3),
    )
    for name, w, b in parts:
        out[f"{prefix}{name}_proj.weight"] = w
        out[f"{prefix}{name}_proj.bias"] = b
    return out


def test_multihead_attention(tmp_path, getkey):
    net = save_torch(
        torch.nn.MultiheadAttention(8, 2, batch_first=True),
        tmp_path / "mha.safetensors",
    )
    sd = safetensors_numpy.load_file(tmp_path / "mha.safetensors")
    biases = dict(
        use_query_bias=True,
        use_key_bias=True,
        use_value_bias=True,
        use_output_bias=True,
    )
    model = nn.MultiheadAttention(2, 8, **biases, key=getkey())
    model, _ = boxwood.load_state_dict(model, attention_state_dict(sd))
    q = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
    kv = np.random.default_rng(1).normal(size=(2, 4, 8)).astype(np.float32)
    want = net(torch.tensor(q), torch.tensor(kv), torch.tensor(kv), need_weights=False)[
        0
    ]
    np.testing.assert_allclose(
        jax.vmap(model)(q, kv, kv), want.detach().numpy(), atol=ATOL
    )


def test_torch_names_that_do_not_fit_are_all_reported(tmp_path, getkey):
    net = save_torch(
        torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)),
        tmp_path / "n.safetensors",
    )
    del net
    with pytest.raises(
        boxwood.CheckpointError,
        match="n.safetensors into the given tree \\(8 problems\\)(.|\\n)*rename the incoming keys with `key_map=`",
    ) as info:
        boxwood.load_state_dict(
            nn.MLP(3, 2, 4, 1, key=getkey()), tmp_path / "n.safetensors"
        )
    assert "0.weight: in the file but not in the model" in info.value.problems
    assert "layers.1.bias: missing from the file" in info.value.problems
