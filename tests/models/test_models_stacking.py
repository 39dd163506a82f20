"""Stacked layers (`boxwood.nn.Stacked`) in `boxwood.models`: per-layer checkpoint
names, loading into one stacked buffer, saving the unrolled model's file, the
sharding rules, and the abstract build remembered between loads. A toy
`Pretrained` model holds the stack, and an unrolled twin holds the same layers as
a list."""

import dataclasses
import os
import re
import subprocess
import sys
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import boxwood
import boxwood.models as bm
from _child_flags import child_env, xla_flags_with_devices
from boxwood import Module, field
from boxwood.models import _pretrained, _stacking
from boxwood.models._model_config import ModelConfig
from boxwood.models._pretrained import Pretrained
from boxwood.nn import Linear, Stacked, StateIndex


@dataclasses.dataclass(frozen=True)
class ToyConfig(ModelConfig):
    dim: int = 4
    depth: int = 3
    table: Any = None  # a dict makes the config unhashable

    model_type: ClassVar[str] = "toy"
    architecture: ClassVar[str] = "ToyStacked"


class Block(Module):
    fc1: Linear
    fc2: Linear

    def __init__(self, dim, dtype, *, key):
        k1, k2 = jax.random.split(key)
        self.fc1 = Linear(dim, 2 * dim, dtype=dtype, key=k1)
        self.fc2 = Linear(2 * dim, dim, dtype=dtype, key=k2)


class ToyStacked(Pretrained):
    embed: Linear
    blocks: Any
    cache: StateIndex
    config: ToyConfig = field(static=True)

    config_class: ClassVar[type] = ToyConfig
    RENAMES: ClassVar[tuple] = ((r"^blocks\.", "model.h."),)

    def __init__(self, config, dtype=None, *, key):
        k1, k2 = jax.random.split(key)
        dtype = dtype or jnp.float32
        self.embed = Linear(config.dim, config.dim, dtype=dtype, key=k1)
        self.blocks = self.make_blocks(config, dtype, k2)
        self.cache = StateIndex(None)
        self.config = config

    @staticmethod
    def make_blocks(config, dtype, key):
        return Stacked(lambda k: Block(config.dim, dtype, key=k), config.depth, key=key)


class ToyUnrolled(ToyStacked):
    @staticmethod
    def make_blocks(config, dtype, key):
        return [
            Block(config.dim, dtype, key=k) for k in jax.random.split(key, config.depth)
        ]


def unrolled(model):
    blocks = [
        jax.tree_util.tree_map(lambda a, i=i: a[i], model.blocks.layers)
        for i in range(model.blocks.depth)
    ]
    out = ToyUnrolled(model.config, key=jax.random.key(0))  # the same `embed`
    return boxwood.tree_at(lambda m: m.blocks, out, blocks)


@pytest.fixture
def model():
    return ToyStacked(ToyConfig(), key=jax.random.key(0))


def test_layer_names_are_the_unrolled_models_names(model):
    names = _stacking.layer_names(model)
    assert names == boxwood._checkpoint.stored_names(unrolled(model))
    assert boxwood._checkpoint.stored_names(_stacking.layer_view(model)) == names
    assert names[2:4] == ["blocks.0.fc1.weight", "blocks.0.fc1.bias"]
    # no `Stacked`: the names are the tree's own
    flat = unrolled(model)
    assert _stacking.layer_names(flat) == boxwood._checkpoint.stored_names(flat)
    assert not _stacking.has_stacks(flat) and _stacking.has_stacks(model)


def test_layer_arrays_are_the_unrolled_state_dict(model):
    got = dict(_stacking.layer_arrays(model))
    want = boxwood.state_dict(unrolled(model))
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_stack_of_the_wrong_depth_is_named(model):
    bad = boxwood.tree_at(lambda m: m.blocks.layers.fc1.bias, model, jnp.zeros((2, 8)))
    with pytest.raises(
        ValueError, match=r"`blocks.layers.fc1.bias` has shape \(2, 8\)"
    ):
        _stacking.layer_names(bad)


def test_save_is_byte_identical_to_the_unrolled_models(model, tmp_path):
    model.save_pretrained(tmp_path / "stacked")
    unrolled(model).save_pretrained(tmp_path / "flat")
    for name in ("model.safetensors", "config.json"):
        stacked = (tmp_path / "stacked" / name).read_bytes()
        assert stacked == (tmp_path / "flat" / name).read_bytes()
    names = boxwood._checkpoint.read_tensors(tmp_path / "stacked" / "model.safetensors")
    assert "model.h.2.fc2.bias" in names and "model.h.layers.fc2.bias" not in names


def test_round_trip_and_interchange_with_the_unrolled_model(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = ToyStacked.from_pretrained(tmp_path)
    assert bool(boxwood.tree_equal(loaded, model))
    assert loaded.blocks.layers.fc1.weight.shape == (3, 8, 4)
    flat = ToyUnrolled.from_pretrained(tmp_path)
    assert bool(boxwood.tree_equal(flat, unrolled(model)))
    flat.save_pretrained(tmp_path / "flat")
    assert bool(
        boxwood.tree_equal(ToyStacked.from_pretrained(tmp_path / "flat"), model)
    )


def test_cast_on_read(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = ToyStacked.from_pretrained(tmp_path, dtype=jnp.bfloat16)
    w = loaded.blocks.layers.fc2.weight
    assert w.dtype == jnp.bfloat16 and w.shape == (3, 4, 8)
    want = np.asarray(model.blocks.layers.fc2.weight).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(w), want)


def _write(path, arrays):
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "toy"}')
    boxwood._checkpoint.write_file(
        path / "model.safetensors", list(arrays.items()), {"format": "pt"}
    )


def test_problems_are_named_per_layer_and_reported_at_once(model, tmp_path):
    arrays = {
        ToyStacked.checkpoint_name(n): a for n, a in _stacking.layer_arrays(model)
    }
    del arrays["model.h.1.fc1.weight"]
    arrays["model.h.2.fc2.bias"] = np.zeros(5, np.float32)
    arrays["model.h.3.fc2.bias"] = np.zeros(4, np.float32)
    _write(tmp_path / "bad", arrays)
    with pytest.raises(boxwood.CheckpointError, match=r"\(3 problems\)") as info:
        ToyStacked.from_pretrained(tmp_path / "bad")
    text = str(info.value)
    assert "blocks.1.fc1.weight: missing from the checkpoint" in text
    assert re.search(
        r"blocks\.2\.fc2\.bias: checkpoint has f32\[5\], model expects f32\[4\]", text
    )
    assert "model.h.3.fc2.bias: in the checkpoint but not in the model" in text
    assert "blocks.layers" not in text


def test_layers_with_extra_unit_axes_load(model, tmp_path):
    arrays = {
        ToyStacked.checkpoint_name(n): a for n, a in _stacking.layer_arrays(model)
    }
    for i in range(3):
        name = f"model.h.{i}.fc1.bias"
        arrays[name] = arrays[name].reshape(1, 8)
    _write(tmp_path / "d", arrays)
    assert bool(boxwood.tree_equal(ToyStacked.from_pretrained(tmp_path / "d"), model))


def test_nested_stacks_unroll_level_by_level():
    inner = lambda k: Stacked(lambda k2: Linear(2, 2, key=k2), 3, key=k)  # noqa: E731
    tree = {"outer": Stacked(inner, 2, key=jax.random.key(0))}
    names = _stacking.layer_names(tree)
    assert names[:2] == ["outer.0.0.weight", "outer.0.0.bias"]
    assert names[-1] == "outer.1.2.bias" and len(names) == 12
    bad = {
        "outer": boxwood.tree_at(
            lambda s: s.layers.layers.weight, tree["outer"], jnp.zeros((2, 4, 2, 2))
        )
    }
    with pytest.raises(ValueError, match=r"`outer.layers.layers.weight` has shape"):
        _stacking.layer_names(bad)
    view = _stacking.layer_view(tree)
    assert boxwood._checkpoint.stored_names(view) == names
    assert view["outer"][1][2].weight.shape == (2, 2)
    arrays = dict(_stacking.layer_arrays(tree))
    np.testing.assert_array_equal(
        arrays["outer.1.2.weight"], np.asarray(tree["outer"].layers.layers.weight[1, 2])
    )


def test_layer_shardings_match_rules_per_layer(model):
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    rules = [(r"blocks\.\d+\.fc1\.weight", P("model", None)), (".*", P())]
    out = _stacking.layer_shardings(model, mesh, rules)
    assert out.blocks.layers.fc1.weight.spec == P(None, "model", None)
    assert out.blocks.layers.fc2.weight.spec == P(None)
    assert out.embed.weight.spec == P()
    # a rule for one layer only cannot shard a stack
    with pytest.raises(
        ValueError, match="split the layers of `blocks.layers.fc1.weight`"
    ):
        _stacking.layer_shardings(
            model, mesh, [(r"blocks\.0\.fc1\.weight", P("model"))]
        )
    flat = unrolled(model)
    leaves = jax.tree_util.tree_leaves
    assert leaves(_stacking.layer_shardings(flat, mesh, rules)) == leaves(
        boxwood.named_shardings(flat, mesh, rules)
    )


def _first_spec(rules, path, shape, mesh):
    spec = next(s for p, s in rules if re.fullmatch(p, path))
    return spec(shape, mesh) if callable(spec) else spec


@pytest.mark.parametrize(
    "cls, per_layer, spec",
    [
        (bm.GPT2LMHeadModel, "transformer.h.{}.attn.c_attn.weight", P(None, "model")),
        (bm.LlamaForCausalLM, "model.layers.{}.mlp.down_proj.weight", P(None, "model")),
        (bm.BertModel, "encoder.layer.{}.intermediate.bias", P("model")),
        (bm.ViTForImageClassification, "vit.encoder.layer.{}.output.bias", P()),
    ],
)
def test_shipped_rules_shard_stacked_layers_as_single_ones(cls, per_layer, spec):
    rules, mesh = bm.sharding_rules(cls), AbstractMesh((2, 4), ("data", "model"))
    assert _first_spec(rules, per_layer.format(5), (), mesh) == spec
    stacked = per_layer.format(_stacking.STACKED_FIELD)
    assert _first_spec(rules, stacked, (), mesh) == P(None, *spec)
    assert _first_spec(rules, "opt.mu." + stacked, (), mesh) == P(None, *spec)
    # FSDP splits a layer as it splits one layer, never the layer axis
    fsdp = bm.sharding_rules(cls, "fsdp")
    shape = (4096, 64, 128)
    assert _first_spec(fsdp, stacked, shape, mesh) == P(None, None, "data")
    assert _first_spec(fsdp, per_layer.format(0), shape, mesh) == P("data")
    assert "per_layer(fsdp(axis='data'" in repr(fsdp[0][1])


def test_stacked_field_is_stackeds_attribute():
    blocks = Stacked(lambda k: Linear(2, 2, key=k), 2, key=jax.random.key(0))
    assert hasattr(blocks, _stacking.STACKED_FIELD)


@pytest.fixture
def builds(monkeypatch):
    """One entry per abstract build `from_pretrained` makes."""
    made = []
    real = _pretrained.filter_eval_shape
    monkeypatch.setattr(
        _pretrained,
        "filter_eval_shape",
        lambda *a, **k: made.append(1) or real(*a, **k),
    )
    return made


def test_abstract_model_is_built_once_and_never_changed(model, tmp_path, builds):
    boxwood.clear_caches()
    model.save_pretrained(tmp_path)
    first = ToyStacked.from_pretrained(tmp_path)
    (kept,) = _pretrained._ABSTRACT.values()
    before = jax.tree_util.tree_leaves(kept)
    mesh = jax.make_mesh((1,), ("data",))
    second = ToyStacked.from_pretrained(tmp_path, mesh=mesh, rules="data_parallel")
    third = ToyStacked.from_pretrained(tmp_path)
    assert len(builds) == 1
    assert bool(boxwood.tree_equal(first, third))
    assert bool(boxwood.tree_equal(first, second))
    after = jax.tree_util.tree_leaves(kept)
    assert len(before) == len(after) and all(a is b for a, b in zip(before, after))
    assert all(getattr(x, "sharding", None) is None for x in after)
    # each load has its own state keys (a `State` walk may rename one in place),
    # equal to the others'
    assert first.cache.marker is not third.cache.marker
    assert first.cache.marker is not kept.cache.marker
    assert first.cache.marker == third.cache.marker
    ToyStacked.from_pretrained(tmp_path, dtype=jnp.bfloat16)  # another dtype: a build
    assert len(builds) == 2
    boxwood.clear_caches()
    ToyStacked.from_pretrained(tmp_path)
    assert len(builds) == 3


def test_an_unhashable_config_is_remembered_by_its_options(builds):
    config = ToyConfig(table={"a": [1, 2]})
    with pytest.raises(TypeError):
        hash(config)
    key = _pretrained._config_key(config)
    assert key == _pretrained._config_key(ToyConfig(table={"a": [1, 2]}))
    assert key != _pretrained._config_key(ToyConfig(table={"a": [1, 3]}))
    boxwood.clear_caches()
    built = _pretrained.abstract_model(ToyStacked, config, jnp.float32)
    again = _pretrained.abstract_model(ToyStacked, config, jnp.float32)
    assert len(builds) == 1 and bool(boxwood.tree_equal(built, again))


SCRIPT = r"""
import sys
import jax, numpy as np
import boxwood
from jax.sharding import PartitionSpec as P
sys.path[:0] = sys.argv[2:]  # this file's folder and tests/ (the helpers)
from test_models_stacking import ToyStacked, ToyConfig

assert jax.device_count() == 8
model = ToyStacked(ToyConfig(dim=8, depth=4), key=jax.random.key(0))
model.save_pretrained(sys.argv[1])
mesh = boxwood.make_mesh((2, 4), ("data", "model"))
rules = [(r"blocks\.\d+\.fc1\.weight", P("model", None)), (".*", P())]
loaded = ToyStacked.from_pretrained(sys.argv[1], mesh=mesh, rules=rules)
w = loaded.blocks.layers.fc1.weight
assert w.sharding.spec == P(None, "model", None), w.sharding
assert {s.data.shape for s in w.addressable_shards} == {(4, 4, 8)}
assert bool(boxwood.tree_equal(jax.device_get(loaded), jax.device_get(model)))
fsdp = ToyStacked.from_pretrained(sys.argv[1], mesh=mesh, rules=boxwood.fsdp("data", 1))
assert fsdp.blocks.layers.fc2.weight.sharding.spec == P(None, None, "data"), fsdp
print("STACKED-SHARDED-OK")
"""


def test_stacked_leaves_load_sharded_on_8_devices(tmp_path):
    env = child_env(XLA_FLAGS=xla_flags_with_devices(8))
    here = os.path.dirname(__file__)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), here, os.path.dirname(here)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "STACKED-SHARDED-OK" in out.stdout, out.stderr[-3000:]
