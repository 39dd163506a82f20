"""Sharding rule sets of `boxwood.models`, and loading straight into a sharding,
on 8 simulated CPU devices (in a subprocess: the device count is fixed when JAX
starts)."""

import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

import boxwood
import boxwood.models as bm
from _hf_models import save_tiny

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
