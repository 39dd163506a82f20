"""`boxwood.models` computes what PyTorch `transformers` computes, on tiny random
checkpoints written by `save_pretrained` (float32: max abs difference <= 1e-4 on
the CPU, 3e-4 on an accelerator).

The float32 checkpoints are drawn wide (`WIDE`: `initializer_range=0.4`, logits of
a few units), so activations leave their linear regime: `test_a_wrong_activation_
would_fail` shows that swapping the tanh GELU for the exact one (or back) moves the
outputs by more than 5x the tolerance."""

import jax
import jax._src.random
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import WIDE, save_tiny, shared_model, shared_tiny, token_ids, torch
from _precision import highest_matmul_precision, tolerance  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


TOL = 1e-4
# On a TPU, even at `highest` precision, logits of a few units are off by up to
# 1.5e-4 (its float32 products and transcendentals are a few ulps off); the CPU
# keeps `TOL`. A swapped GELU moves them by 8.5e-4 or more (measured on the CPU:
# `test_a_wrong_activation_would_fail` asks for more than 5x `TOL`), still well
# outside the accelerator's figure.
LOGITS_TOL = tolerance(cpu=TOL, accelerator=3e-4)


# Compiled once per model structure and input shape, for every test of the module
# (`test_a_wrong_activation_would_fail` compiles its swapped model afresh).
@boxwood.filter_jit
def _batched(model, *args):
    return jax.vmap(model)(*args)


@boxwood.filter_jit
def _single(model, *args):
    return model(*args)


def _logits(torch_model, ids):
    with torch.no_grad():
        return torch_model(torch.tensor(ids)).logits.float().numpy()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_causal_lm_matches_pytorch(kind):
    model, reference = shared_model(kind, **WIDE)
    assert type(model).__name__ == type(reference).__name__
    ids = token_ids(1, (3, 17))
    out = _batched(model, jnp.asarray(ids))
    assert out.shape == (3, 17, 97) and out.dtype == jnp.float32
    assert np.abs(np.asarray(out) - _logits(reference, ids)).max() <= LOGITS_TOL
    single = _single(model, jnp.asarray(ids[0, :5]))
    assert np.abs(np.asarray(single) - np.asarray(out[0, :5])).max() <= LOGITS_TOL


def test_llama_grouped_query_untied_rope_theta(tmp_path):
    reference = save_tiny(
        "llama", tmp_path, num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, attention_bias=True,
        **WIDE,
    )  # fmt: skip
    model = bm.LlamaForCausalLM.from_pretrained(tmp_path)
    assert model.lm_head is not None and model.config.kv_heads == 2
    assert model.config.rope_theta == 500.0
    # (2 stacked layers; read without slicing every leaf of the stack)
    assert model.model.layers.layers.self_attn.k_proj.weight.shape == (2, 16, 32)
    ids = token_ids(2, (2, 23))
    out = _batched(model, jnp.asarray(ids))
    assert np.abs(np.asarray(out) - _logits(reference, ids)).max() <= LOGITS_TOL


def test_llama_tied_embeddings(tmp_path):
    reference = save_tiny("llama", tmp_path, tie_word_embeddings=True, **WIDE)
    model = bm.LlamaForCausalLM.from_pretrained(tmp_path)
    assert model.lm_head is None
    ids = token_ids(3, (1, 9))
    out = _batched(model, jnp.asarray(ids))
    assert np.abs(np.asarray(out) - _logits(reference, ids)).max() <= LOGITS_TOL


def test_bert_padded_batch_with_mask():
    directory, reference = shared_tiny("bert", **WIDE)
    model = bm.BertModel.from_pretrained(directory)
    ids = token_ids(4, (3, 12))
    mask = np.ones((3, 12), np.int64)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    types = np.zeros((3, 12), np.int64)
    types[:, 6:] = 1
    out = _batched(model, *map(jnp.asarray, (ids, mask, types)))
    with torch.no_grad():
        expected = reference(
            torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            token_type_ids=torch.tensor(types),
        ).last_hidden_state.numpy()
    assert out.shape == (3, 12, 32)
    assert np.abs(np.asarray(out) - expected).max() <= LOGITS_TOL
    # The real tokens of a padded sequence do not see the padding.
    alone = _single(model, jnp.asarray(ids[2, :3]), None, jnp.asarray(types[2, :3]))
    assert np.abs(np.asarray(alone) - np.asarray(out[2, :3])).max() <= LOGITS_TOL
    # Defaults: no padding, one segment.
    plain = _single(model, jnp.asarray(ids[0]))
    with torch.no_grad():
        expected = reference(torch.tensor(ids[:1])).last_hidden_state.numpy()[0]
    assert np.abs(np.asarray(plain) - expected).max() <= LOGITS_TOL


def test_vit_matches_pytorch():
    model, reference = shared_model("vit", **WIDE)
    assert isinstance(model, bm.ViTForImageClassification)
    pixels = np.random.RandomState(5).randn(3, 3, 16, 16).astype(np.float32)
    out = _batched(model, jnp.asarray(pixels))
    with torch.no_grad():
        expected = reference(torch.tensor(pixels)).logits.numpy()
    assert out.shape == (3, 5)
    assert np.abs(np.asarray(out) - expected).max() <= LOGITS_TOL
    assert model.config.labels == tuple(f"LABEL_{i}" for i in range(5))


def test_bfloat16_checkpoint_stays_bfloat16(tmp_path):
    reference = save_tiny("llama", tmp_path, dtype=torch.bfloat16)
    model = bm.from_pretrained(tmp_path)
    dtypes = {x.dtype for x in jax.tree_util.tree_leaves(model)}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    ids = token_ids(6, (1, 8))
    out = _batched(model, jnp.asarray(ids))
    assert out.dtype == jnp.bfloat16
    # bfloat16 rounding differs between the two implementations; logits agree
    # to bfloat16 precision.
    assert np.abs(np.asarray(out, np.float32) - _logits(reference, ids)).max() < 0.1


def test_dtype_argument_casts_on_read():
    directory, _ = shared_tiny("gpt2")
    model = bm.GPT2LMHeadModel.from_pretrained(directory, dtype=jnp.bfloat16)
    # the stacked blocks' leaf, sliced alone (`h[0]` would slice every leaf,
    # each shape compiling a slice of its own)
    weight = model.transformer.h.layers.attn.c_attn.weight[0]
    assert weight.dtype == jnp.bfloat16 and weight.shape == (32, 96)  # (in, out)
    full = bm.GPT2LMHeadModel.from_pretrained(directory)
    expected = np.asarray(full.transformer.h.layers.attn.c_attn.weight[0]).astype(
        ml_dtypes.bfloat16
    )
    np.testing.assert_array_equal(np.asarray(weight), expected)


def test_sharded_checkpoint(tmp_path):
    _, reference = shared_tiny("gpt2", **WIDE)
    reference.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert not (tmp_path / "model.safetensors").exists()
    model = bm.from_pretrained(tmp_path)
    ids = token_ids(7, (3, 17))  # the shape of `test_causal_lm_matches_pytorch`
    out = _batched(model, jnp.asarray(ids))
    assert np.abs(np.asarray(out) - _logits(reference, ids)).max() <= LOGITS_TOL


def test_loading_builds_nothing_random(monkeypatch):
    directory, _ = shared_tiny("gpt2")
    boxwood.clear_caches()  # the abstract build of an earlier load is remembered
    calls = []
    real = jax.random.normal

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax.random, "normal", counting)
    # (`jax.nn.initializers.normal`, which the models draw with, calls it here)
    monkeypatch.setattr(jax._src.random, "normal", counting)
    model = bm.GPT2LMHeadModel.from_pretrained(directory)
    # The recorder saw the (abstract) build run GPT-2's initialisers ...
    # wte, wpe, and c_attn, c_proj, c_fc, c_proj once for the stacked blocks
    assert len(calls) >= 2 + 4
    # ... under `filter_eval_shape`: on abstract values only.
    assert all(isinstance(a[0], jax.core.Tracer) for a in calls)
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(model))


def _tanh_gelu(x):
    return jax.nn.gelu(x, approximate=True)


def _exact_gelu(x):
    return jax.nn.gelu(x, approximate=False)


@pytest.mark.parametrize(
    "kind, name, wrong",
    [("gpt2", "gelu_new", _exact_gelu), ("bert", "gelu", _tanh_gelu)],
)
def test_a_wrong_activation_would_fail(kind, name, wrong, monkeypatch):
    """With the checkpoint's GELU swapped for the other form, boxwood's outputs
    are off by more than 5x `TOL`: the exactness tests above would catch it."""
    from boxwood.models import _blocks

    model, reference = shared_model(kind, **WIDE)
    ids = token_ids(1, (3, 17))
    with torch.no_grad():
        out = reference(torch.tensor(ids))
    expected = (out.last_hidden_state if kind == "bert" else out.logits).numpy()
    right = _batched(model, jnp.asarray(ids))
    assert np.abs(np.asarray(right) - expected).max() <= LOGITS_TOL
    monkeypatch.setitem(_blocks._ACTIVATIONS, name, wrong)
    # a fresh compile (`_batched` would reuse the code traced before the swap)
    swapped = boxwood.filter_jit(jax.vmap(model))(jnp.asarray(ids))
    assert np.abs(np.asarray(swapped) - expected).max() > 5 * TOL
