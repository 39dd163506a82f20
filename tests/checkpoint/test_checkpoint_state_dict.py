"""`boxwood.state_dict` / `load_state_dict`: flat dicts, key maps, reports."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn

torch = pytest.importorskip("torch")


def test_state_dict_round_trip(getkey):
    model = nn.MLP(3, 2, 4, 1, key=getkey())
    sd = boxwood.state_dict((model, jax.random.key(1)))
    assert list(sd) == [
        "0.layers.0.weight",
        "0.layers.0.bias",
        "0.layers.1.weight",
        "0.layers.1.bias",
        "1",
    ]
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    assert sd["1"].dtype == np.uint32
    like = (nn.MLP(3, 2, 4, 1, key=getkey()), jax.random.key(7))
    new, report = boxwood.load_state_dict(like, sd)
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert boxwood.tree_equal(new[0], model)
    assert (
        jax.random.key_data(new[1]).tolist()
        == jax.random.key_data(jax.random.key(1)).tolist()
    )


def test_key_map_dict_and_callable(getkey):
    model = nn.MLP(3, 2, 4, 1, key=getkey())
    incoming = {
        f"net.{k.replace('layers.', '')}": v
        for k, v in boxwood.state_dict(model).items()
    }
    new, _ = boxwood.load_state_dict(
        model, incoming, key_map=lambda k: "layers." + k.removeprefix("net.")
    )
    assert boxwood.tree_equal(new, model)
    renames = {
        f"net.{i}.{p}": f"layers.{i}.{p}" for i in (0, 1) for p in ("weight", "bias")
    }
    new, _ = boxwood.load_state_dict(model, incoming, key_map=renames)
    assert boxwood.tree_equal(new, model)
    with pytest.raises(
        boxwood.CheckpointError,
        match="`key_map` gives two incoming keys the same name 'layers.0.bias'",
    ):
        boxwood.load_state_dict(
            model,
            {"a": np.zeros(1), "b": np.zeros(1)},
            key_map=lambda k: "layers.0.bias",
        )
    with pytest.raises(TypeError, match="`key_map` must be a dict"):
        boxwood.load_state_dict(model, incoming, key_map=["x"])
    with pytest.raises(
        TypeError, match="must give a string .* for 'net.0.weight', got 3"
    ):
        boxwood.load_state_dict(model, incoming, key_map=lambda k: 3)


def test_strict_reports_everything_non_strict_returns_a_report(getkey):
    model = nn.Linear(3, 2, key=getkey())
    incoming = {"weight": torch.zeros(2, 4), "extra": torch.zeros(1)}
    with pytest.raises(boxwood.CheckpointError) as info:
        boxwood.load_state_dict(model, incoming)
    assert info.value.problems == [
        "bias: missing from the state dict",
        "extra: in the state dict but not in the model",
        "weight: state dict has f32[2,4], model expects f32[2,3]",
    ]
    new, report = boxwood.load_state_dict(
        model, {"weight": torch.ones(2, 3), "extra": torch.zeros(1)}, strict=False
    )
    assert report.missing_keys == ["bias"] and report.unexpected_keys == ["extra"]
    assert new.weight.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert new.bias is model.bias


def test_size_one_axes_are_reshaped_and_dtypes_must_match(getkey):
    conv = nn.Conv2d(2, 3, 3, key=getkey())
    new, _ = boxwood.load_state_dict(
        conv,
        {
            "weight": np.ones((3, 2, 3, 3), np.float32),
            "bias": np.arange(3, dtype=np.float32),
        },
    )
    assert new.bias.shape == (3, 1, 1) and new.bias[:, 0, 0].tolist() == [0, 1, 2]
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"bias: state dict has f64\[3\], model expects f32\[3,1,1\]",
    ):
        boxwood.load_state_dict(
            conv, {"weight": np.ones((3, 2, 3, 3), np.float32), "bias": np.zeros(3)}
        )


def test_torch_bfloat16_and_bad_values(getkey):
    tree = {"w": jnp.zeros(3, jnp.bfloat16)}
    new, _ = boxwood.load_state_dict(
        tree, {"w": torch.tensor([1.5, -2.0, 3e38], dtype=torch.bfloat16)}
    )
    assert new["w"].dtype == jnp.bfloat16
    assert (
        new["w"].astype(jnp.float32).tolist()
        == torch.tensor([1.5, -2.0, 3e38], dtype=torch.bfloat16).float().tolist()
    )
    with pytest.raises(
        boxwood.CheckpointError, match=r"`state_dict\['w'\]` is a list, not an array"
    ):
        boxwood.load_state_dict(tree, {"w": [1, 2, 3]})
    with pytest.raises(
        TypeError,
        match="`state_dict` must be a dict of arrays or the path of a safetensors file, got list",
    ):
        boxwood.load_state_dict(tree, [])
