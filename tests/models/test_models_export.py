"""`save_pretrained`: boxwood models written so that `transformers` loads them, and
back (boxwood -> PyTorch -> boxwood)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import token_ids, torch, transformers
from _precision import highest_matmul_precision  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

TOL = 1e-4

CONFIGS = {
    "gpt2": bm.GPT2Config(
        vocab_size=61, n_positions=32, n_embd=16, n_layer=2, n_head=2
    ),
    "llama": bm.LlamaConfig(
        vocab_size=61,
        hidden_size=16,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rope_theta=1000.0,
    ),  # fmt: skip
    "bert": bm.BertConfig(
        vocab_size=61,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
    ),  # fmt: skip
    "vit": bm.ViTConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        image_size=8,
        patch_size=4,
        labels=("cat", "dog", "eel"),
    ),  # fmt: skip
}
CLASSES = {
    "gpt2": bm.GPT2LMHeadModel,
    "llama": bm.LlamaForCausalLM,
    "bert": bm.BertModel,
    "vit": bm.ViTForImageClassification,
}


def _torch_out(kind, model, x):
    with torch.no_grad():
        out = model(torch.tensor(x)[None])
    return (out.last_hidden_state if kind == "bert" else out.logits)[0].numpy()


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_boxwood_model_loads_in_transformers(kind, tmp_path):
    # built in training mode: called here in inference, as `transformers`' `eval()`
    model = boxwood.nn.inference_mode(
        CLASSES[kind](CONFIGS[kind], key=jax.random.key(3))
    )
    bm.save_pretrained(model, tmp_path)
    reference = (
        getattr(transformers, type(model).__name__).from_pretrained(tmp_path).eval()
    )
    if kind == "vit":
        x = np.random.RandomState(0).randn(3, 8, 8).astype(np.float32)
        assert reference.config.id2label == {0: "cat", 1: "dog", 2: "eel"}
    else:
        x = token_ids(0, (11,), vocab=61)
    ours = boxwood.filter_jit(model)(jnp.asarray(x))
    assert np.abs(np.asarray(ours) - _torch_out(kind, reference, x)).max() <= TOL
    # ... and back: boxwood -> PyTorch -> boxwood gives the same arrays.
    reference.save_pretrained(tmp_path / "again")
    again = bm.from_pretrained(tmp_path / "again")
    for a, b in zip(jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_writes_checkpoint_names_and_layouts(tmp_path):
    model = bm.GPT2LMHeadModel(CONFIGS["gpt2"], key=jax.random.key(0))
    model.save_pretrained(tmp_path)
    from safetensors.numpy import load_file

    tensors = load_file(tmp_path / "model.safetensors")
    # block 1's leaf, sliced alone (`h[1]` slices every leaf of the stack)
    weight = model.transformer.h.layers.attn.c_attn.weight[1]
    np.testing.assert_array_equal(
        tensors["transformer.h.1.attn.c_attn.weight"], np.asarray(weight)
    )
    assert "lm_head.weight" not in tensors  # tied, as transformers stores GPT-2
    options = json.loads((tmp_path / "config.json").read_text())
    assert options["model_type"] == "gpt2" and options["architectures"] == [
        "GPT2LMHeadModel"
    ]
    assert bm.GPT2Config.from_dict(options) == model.config


def test_bfloat16_export(tmp_path):
    model = bm.LlamaForCausalLM(CONFIGS["llama"], jnp.bfloat16, key=jax.random.key(1))
    bm.save_pretrained(model, tmp_path)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert reference.model.embed_tokens.weight.dtype == torch.bfloat16
    loaded = bm.from_pretrained(tmp_path)
    assert loaded.model.norm.weight.dtype == jnp.bfloat16


def test_a_failed_save_leaves_the_previous_files_whole(tmp_path, monkeypatch):
    from boxwood._checkpoint import _safetensors  # where the weights file is written

    model = bm.GPT2LMHeadModel(CONFIGS["gpt2"], key=jax.random.key(0))
    model = boxwood.nn.inference_mode(model)  # as loaded, for one compiled forward
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = _safetensors.write_arrays

    def fails_part_way(f, arrays, metadata, *rest):
        real(f, arrays[:1], metadata)  # some bytes reach the file, then a crash
        raise OSError("disk full")

    monkeypatch.setattr(_safetensors, "write_arrays", fails_part_way)
    other = bm.GPT2LMHeadModel(CONFIGS["gpt2"], key=jax.random.key(1))
    with pytest.raises(OSError, match="disk full"):
        other.save_pretrained(tmp_path)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # the old files, whole, and no temporary file left
    loaded = bm.GPT2LMHeadModel.from_pretrained(tmp_path)
    ids = jnp.arange(5)
    forward = boxwood.filter_jit(lambda model: model(ids))  # one compile: one structure
    np.testing.assert_array_equal(forward(loaded), forward(model))
