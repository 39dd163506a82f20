"""Sharding rule sets of `boxwood.models`, and loading straight into a sharding,
on 8 simulated CPU devices (in a subprocess: the device count is fixed when JAX
starts), for GPT-2, BERT and ViT here, and for the Llama family (Llama, Mistral,
Qwen2, Gemma) in `test_models_families.py`."""

import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

import boxwood
import boxwood.models as bm
from _child_flags import child_env, xla_flags_with_devices
from _hf_models import WIDE, shared_tiny, torch

SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm
from jax.sharding import PartitionSpec as P

assert jax.device_count() == 8
mesh = boxwood.make_mesh((2, 4), ("data", "model"))


def split_over(model, axis):
    # the paths of the leaves whose sharding splits them over `axis`
    leaves = jax.tree_util.tree_leaves_with_path(model)
    return [jax.tree_util.keystr(p) for p, x in leaves if axis in str(x.sharding.spec)]


def gpt2(path, expected):
    model = bm.from_pretrained(path, mesh=mesh, rules="tensor_parallel")
    w = model.transformer.h[0].attn.c_attn.weight
    assert w.sharding.spec == P(None, "model"), w.sharding
    assert {s.data.shape for s in w.addressable_shards} == {(32, 24)}
    assert model.transformer.ln_f.weight.sharding.spec == P()
    batch = jnp.asarray(expected["batch"])
    out = boxwood.filter_jit(jax.vmap(model))(boxwood.shard_batch(batch, mesh))
    assert np.abs(np.asarray(out) - expected["out"]).max() <= 1e-4
    greedy = bm.generate(model, batch[0], 8)
    np.testing.assert_array_equal(np.asarray(greedy), expected["greedy"])
    # a ragged batch (vmapped, left-padded) streamed through the callback
    seen = []
    ragged = [batch[0], batch[1, :4]]
    out = bm.generate(model, ragged, 8, eos_token_id=None, callback=seen.append)
    np.testing.assert_array_equal(np.asarray(out), expected["ragged"])
    np.testing.assert_array_equal(np.stack(seen, axis=1), expected["ragged"][:, 10:])
    fsdp = bm.from_pretrained(path, mesh=mesh, rules=bm.sharding_rules(model, "fsdp"))
    assert fsdp.transformer.wte.weight.sharding.spec == P(None, "data")
    print("MODELS-SHARDED-OK")


def other(kind, path, expected):
    model = bm.from_pretrained(path, mesh=mesh, rules="tensor_parallel")
    split = split_over(model, "model")
    assert len(split) >= 4 * 2, (kind, split)  # q, k, v, out (and MLP) per layer
    for leaf in jax.tree_util.tree_leaves(model):
        assert len(leaf.sharding.device_set) == 8, kind  # placed, not on one device
    batch = jnp.asarray(expected["batch"])
    with jax.default_matmul_precision("highest"):
        out = boxwood.filter_jit(jax.vmap(model))(boxwood.shard_batch(batch, mesh))
    assert np.abs(np.asarray(out) - expected["out"]).max() <= 1e-4, kind
    fsdp = bm.from_pretrained(path, mesh=mesh, rules="fsdp")
    assert split_over(fsdp, "data"), kind
    print("SHARDED", kind)


for kind, path, expected in zip(*[iter(sys.argv[1:])] * 3):
    if kind == "gpt2":
        gpt2(path, np.load(expected))
    else:
        other(kind, path, np.load(expected))
print("EVERY-FAMILY-SHARDED-OK")
"""

# GPT-2 (with generation), BERT and ViT here; the Llama family (Llama, Mistral,
# Qwen2, Gemma) in `test_models_families.py`'s 8-device test, with the same checks.
FAMILIES = ("bert", "vit")


def _expected(kind, reference, batch):
    """What `transformers` computes for `batch` (and, for GPT-2, its greedy
    continuation of the first row, and of a ragged batch of the first row and
    the first four tokens of the second)."""
    with torch.no_grad():
        out = reference(torch.tensor(batch))
        if kind == "gpt2":
            greedy = [
                reference.generate(
                    torch.tensor(prompt)[None], max_new_tokens=8, do_sample=False,
                    eos_token_id=None, pad_token_id=0,
                )[0].numpy()
                for prompt in (batch[0], batch[1, :4])
            ]  # fmt: skip
            # the ragged batch's rows: each prompt's continuation alone, the
            # short one left-padded with the default pad (the end token, 2)
            ragged = np.stack([greedy[0], np.pad(greedy[1], (6, 0), constant_values=2)])
            return dict(
                batch=batch, out=out.logits.numpy(), greedy=greedy[0], ragged=ragged
            )
    if kind == "bert":
        return dict(batch=batch, out=out.last_hidden_state.numpy())
    return dict(batch=batch, out=out.logits.numpy())


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """One subprocess on 8 simulated devices loads each checkpoint sharded and
    compares it with `transformers`' outputs, written here."""
    ids = np.arange(3, 13)
    arguments = []
    for kind in ("gpt2", *FAMILIES):
        directory, reference = shared_tiny(kind) if kind == "gpt2" else (
            shared_tiny(kind, **WIDE)
        )  # fmt: skip
        if kind == "vit":
            batch = np.random.RandomState(0).randn(2, 3, 16, 16).astype(np.float32)
        else:
            batch = np.stack([ids, ids[::-1]])
        expected = tmp_path_factory.mktemp(kind) / "expected.npz"
        np.savez(expected, **_expected(kind, reference, batch))
        arguments += [kind, str(directory), str(expected)]
    env = child_env(XLA_FLAGS=xla_flags_with_devices(8))
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_tensor_parallel_load_and_generate_on_8_devices(sharded_run):
    out = sharded_run
    assert "MODELS-SHARDED-OK" in out.stdout, out.stdout + out.stderr[-3000:]


def test_every_family_loads_sharded_on_8_devices(sharded_run):
    """GPT-2 above; here BERT and ViT: tensor-parallel and FSDP loads straight
    into their shardings, computing what `transformers` does."""
    out = sharded_run
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
