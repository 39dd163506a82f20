"""Sharding rule sets of `boxwood.models`, and loading straight into a sharding,
on 8 simulated CPU devices (in a subprocess: the device count is fixed when JAX
starts), for every family: GPT-2, Llama, Mistral, Qwen2, Gemma, BERT and ViT."""

import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

import boxwood
import boxwood.models as bm
from _hf_models import WIDE, save_tiny

SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm
from jax.sharding import PartitionSpec as P

assert jax.device_count() == 8
path = sys.argv[1]
mesh = boxwood.make_mesh((2, 4), ("data", "model"))
plain = bm.from_pretrained(path)
model = bm.from_pretrained(path, mesh=mesh, rules="tensor_parallel")
w = model.transformer.h[0].attn.c_attn.weight
assert w.sharding.spec == P(None, "model"), w.sharding
assert {s.data.shape for s in w.addressable_shards} == {(32, 24)}
assert model.transformer.ln_f.weight.sharding.spec == P()
ids = jnp.asarray(np.arange(3, 13))
batch = jnp.stack([ids, ids[::-1]])
out = boxwood.filter_jit(jax.vmap(model))(boxwood.shard_batch(batch, mesh))
ref = boxwood.filter_jit(jax.vmap(plain))(batch)
assert np.abs(np.asarray(out) - np.asarray(ref)).max() <= 1e-4
np.testing.assert_array_equal(
    np.asarray(bm.generate(model, ids, 8)), np.asarray(bm.generate(plain, ids, 8))
)
fsdp = bm.from_pretrained(path, mesh=mesh, rules=bm.sharding_rules(plain, "fsdp"))
assert fsdp.transformer.wte.weight.sharding.spec == P(None, "data")
print("MODELS-SHARDED-OK")
"""


def test_tensor_parallel_load_and_generate_on_8_devices(tmp_path):
    save_tiny("gpt2", tmp_path)
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "MODELS-SHARDED-OK" in out.stdout, out.stderr[-3000:]


FAMILIES_SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm

assert jax.device_count() == 8
mesh = boxwood.make_mesh((2, 4), ("data", "model"))


def split_over(model, axis):
    # the paths of the leaves whose sharding splits them over `axis`
    leaves = jax.tree_util.tree_leaves_with_path(model)
    return [jax.tree_util.keystr(p) for p, x in leaves if axis in str(x.sharding.spec)]


for kind, path in zip(sys.argv[1::2], sys.argv[2::2]):
    plain = bm.from_pretrained(path)
    model = bm.from_pretrained(path, mesh=mesh, rules="tensor_parallel")
    assert type(model) is type(plain), kind
    split = split_over(model, "model")
    assert len(split) >= 4 * 2, (kind, split)  # q, k, v, out (and MLP) per layer
    for leaf in jax.tree_util.tree_leaves(model):
        assert len(leaf.sharding.device_set) == 8, kind  # placed, not on one device
    if kind == "vit":
        batch = jnp.asarray(np.random.RandomState(0).randn(2, 3, 16, 16), jnp.float32)
    else:
        ids = jnp.asarray(np.arange(3, 13))
        batch = jnp.stack([ids, ids[::-1]])
    with jax.default_matmul_precision("highest"):
        out = boxwood.filter_jit(jax.vmap(model))(boxwood.shard_batch(batch, mesh))
        ref = boxwood.filter_jit(jax.vmap(plain))(batch)
        assert np.abs(np.asarray(out) - np.asarray(ref)).max() <= 1e-4, kind
        if kind not in ("bert", "vit"):
            np.testing.assert_array_equal(
                np.asarray(bm.generate(model, ids, 8)),
                np.asarray(bm.generate(plain, ids, 8)),
                err_msg=kind,
            )
    fsdp = bm.from_pretrained(path, mesh=mesh, rules="fsdp")
    assert split_over(fsdp, "data"), kind
    print("SHARDED", kind)
print("EVERY-FAMILY-SHARDED-OK")
"""

FAMILIES = ("llama", "mistral", "qwen2", "gemma", "bert", "vit")


def test_every_family_loads_sharded_on_8_devices(tmp_path):
    """GPT-2 above; here every other family: tensor-parallel and FSDP loads
    straight into their shardings, computing what the unsharded model does."""
    arguments = []
    for kind in FAMILIES:
        save_tiny(kind, tmp_path / kind, **WIDE)
        arguments += [kind, str(tmp_path / kind)]
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
    )
    out = subprocess.run(
        [sys.executable, "-c", FAMILIES_SCRIPT, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert "EVERY-FAMILY-SHARDED-OK" in out.stdout, out.stdout + out.stderr[-3000:]
    assert out.stdout.count("SHARDED ") == len(FAMILIES)


@pytest.mark.parametrize(
    "cls, config",
    [
        (
            bm.GPT2LMHeadModel,
            bm.GPT2Config(n_layer=1, n_embd=16, n_head=4, vocab_size=10, n_positions=8),
        ),
        (
            bm.LlamaForCausalLM,
            bm.LlamaConfig(16, 16, 32, 1, 4, 2, max_position_embeddings=8),
        ),
        (bm.BertModel, bm.BertConfig(10, 16, 1, 4, 32, max_position_embeddings=8)),
        (
            bm.ViTForImageClassification,
            bm.ViTConfig(16, 1, 4, 32, image_size=8, patch_size=4),
        ),
    ],
)
def test_every_linear_is_split_by_tensor_parallel(cls, config):
    abstract = boxwood.filter_eval_shape(cls, config, key=jax.random.key(0))
    mesh = AbstractMesh((2, 4), ("data", "model"))
    plan = boxwood.sharding_plan(abstract, mesh, bm.sharding_rules(cls), show=False)
    specs = {row.path: row.spec for row in plan.rows}
    weights = [
        p
        for p in specs
        if p.endswith("weight") and "norm" not in p.lower() and "ln_" not in p
    ]
    assert weights
    # Replicated by design: position tables, the pooler, classifier and patch
    # projection (small, and feeding no row-parallel partner).
    small = (
        "position",
        "wpe",
        "token_type",
        "pooler",
        "classifier",
        "patch_embeddings",
    )
    for path in weights:
        split = "model" in str(specs[path])
        assert split != any(s in path for s in small), (path, specs[path])


def test_rule_set_errors():
    assert bm.sharding_rules(bm.BertModel, "data_parallel") == [(".*", PartitionSpec())]
    with pytest.raises(
        ValueError,
        match="`strategy` must be 'data_parallel', 'fsdp' or 'tensor_parallel'",
    ):
        bm.sharding_rules(bm.BertModel, "pipeline")
    with pytest.raises(TypeError, match="use `boxwood.tensor_parallel"):
        bm.sharding_rules(boxwood.nn.Linear, "tensor_parallel")
