"""Checkpoints in the layouts published on the Hugging Face Hub load, and load
exactly what the `save_pretrained` layout of the same weights loads.

Each fixture is written here from the published tensor names: the Hub's `gpt2`
file (no `transformer.` prefix, `attn.bias`/`attn.masked_bias` buffers), the
Hub's `bert-base-uncased` (`bert.` prefix, `LayerNorm.gamma`/`beta`, the
pretraining heads), `BertForMaskedLM`/`BertForTokenClassification` files (no
pooler), and older Llama files (`rotary_emb.inv_freq` buffers)."""

import shutil

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import CONFIGS, shared_tiny, token_ids, torch, transformers
from _precision import tolerance

safetensors_numpy = pytest.importorskip("safetensors.numpy")

LAYERS = 2  # the tiny models' `n_layer` / `num_hidden_layers`
# Outputs against PyTorch's: 1e-4 on the CPU; a TPU's float32 was off by up to
# 9.7e-4 (a v5e, before the suite ran at `highest` precision there). A tensor
# loaded under the wrong name moves them by far more.
ATOL = tolerance(cpu=1e-4, accelerator=2e-3)


def gpt2_published_names(layers):
    """The tensor names of the Hub's `gpt2` `model.safetensors`."""
    names = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    for i in range(layers):
        names += [f"h.{i}.attn.bias"]
        names += [
            f"h.{i}.{p}.{w}" for p in ("ln_1", "ln_2") for w in ("weight", "bias")
        ]
        names += [
            f"h.{i}.{p}.{w}"
            for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
            for w in ("weight", "bias")
        ]
    return names


def bert_base_uncased_names(layers):
    """The tensor names of the Hub's `bert-base-uncased` `model.safetensors`."""
    norm = ("gamma", "beta")
    dense = ("weight", "bias")
    names = [
        f"bert.embeddings.{e}.weight"
        for e in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ]
    names += [f"bert.embeddings.LayerNorm.{w}" for w in norm]
    for i in range(layers):
        p = f"bert.encoder.layer.{i}"
        names += [
            f"{p}.attention.self.{q}.{w}"
            for q in ("query", "key", "value")
            for w in dense
        ]
        names += [f"{p}.attention.output.dense.{w}" for w in dense]
        names += [f"{p}.attention.output.LayerNorm.{w}" for w in norm]
        names += [f"{p}.intermediate.dense.{w}" for w in dense]
        names += [f"{p}.output.dense.{w}" for w in dense]
        names += [f"{p}.output.LayerNorm.{w}" for w in norm]
    names += [f"bert.pooler.dense.{w}" for w in dense]
    names += ["cls.predictions.bias"]
    names += [f"cls.predictions.transform.dense.{w}" for w in dense]
    names += [f"cls.predictions.transform.LayerNorm.{w}" for w in norm]
    names += [f"cls.seq_relationship.{w}" for w in dense]
    return names


def _write_layout(src, dst, tensors):
    """`dst`: `src`'s `config.json` beside a `model.safetensors` of `tensors`."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    safetensors_numpy.save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()},
        str(dst / "model.safetensors"),
        metadata={"format": "pt"},
    )


def _weights(directory):
    return safetensors_numpy.load_file(str(directory / "model.safetensors"))


def assert_same_model(a, b):
    assert jtu.tree_structure(a) == jtu.tree_structure(b)
    for x, y in zip(jtu.tree_leaves(a), jtu.tree_leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(np.asarray(x), np.asarray(y))


def test_hub_gpt2_layout(tmp_path):
    sp, reference = shared_tiny("gpt2")
    saved = _weights(sp)
    n = reference.config.n_positions
    causal = np.tril(np.ones((n, n), np.float32))[None, None]
    published = {}
    for name in gpt2_published_names(LAYERS):
        published[name] = (
            causal if name.endswith(".attn.bias") else saved[f"transformer.{name}"]
        )
    published["h.1.attn.masked_bias"] = np.array(-1e4, np.float32)  # some files
    _write_layout(sp, tmp_path / "hub", published)

    model = bm.from_pretrained(tmp_path / "hub")
    assert isinstance(model, bm.GPT2LMHeadModel)
    assert_same_model(model, bm.from_pretrained(sp))
    ids = token_ids(0, (11,))
    with torch.no_grad():
        expected = reference(torch.tensor(ids)[None]).logits[0].numpy()
    got = boxwood.filter_jit(model)(jnp.asarray(ids))
    assert np.abs(np.asarray(got) - expected).max() <= ATOL


def _bert_pretraining(directory, seed=0):
    torch.manual_seed(seed)
    model = transformers.BertForPreTraining(CONFIGS["bert"]()).eval()
    model.save_pretrained(str(directory))
    return model


def _old_norm_name(name):
    """`save_pretrained`'s name of a tensor of bert-base-uncased's file."""
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight")
    return name.replace("LayerNorm.beta", "LayerNorm.bias")


def test_hub_bert_base_uncased_layout(tmp_path):
    reference = _bert_pretraining(tmp_path / "sp")
    saved = _weights(tmp_path / "sp")
    published = {
        name: saved[_old_norm_name(name)] for name in bert_base_uncased_names(LAYERS)
    }
    _write_layout(tmp_path / "sp", tmp_path / "hub", published)
    # the same body, as `BertModel.save_pretrained` lays it out
    body = {
        k.removeprefix("bert."): v for k, v in saved.items() if k.startswith("bert.")
    }
    _write_layout(tmp_path / "sp", tmp_path / "body", body)

    with pytest.warns(UserWarning, match=r"holds `cls\.predictions\.bias`.*dropped"):
        model = bm.BertModel.from_pretrained(tmp_path / "hub")
    assert model.pooler is not None
    assert_same_model(model, bm.BertModel.from_pretrained(tmp_path / "body"))
    ids = token_ids(1, (9,))
    with torch.no_grad():
        out = reference.bert(torch.tensor(ids)[None])
    hidden = boxwood.filter_jit(model)(jnp.asarray(ids))
    assert np.abs(np.asarray(hidden) - out.last_hidden_state[0].numpy()).max() <= ATOL
    pooled = model.pooled(hidden)
    assert np.abs(np.asarray(pooled) - out.pooler_output[0].numpy()).max() <= ATOL
    # the whole file, both pre-training heads included
    both = bm.BertForPreTraining.from_pretrained(tmp_path / "hub")
    assert_same_model(both.bert, model)
    for ours, theirs in [
        (both.cls.seq_relationship.weight, reference.cls.seq_relationship.weight),
        (both.cls.predictions.bias, reference.cls.predictions.bias),
    ]:
        np.testing.assert_array_equal(ours, theirs.detach().numpy())


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForTokenClassification"])
def test_bert_heads_without_pooler(head, tmp_path):
    torch.manual_seed(0)
    reference = getattr(transformers, head)(CONFIGS["bert"]()).eval()
    reference.save_pretrained(str(tmp_path))
    names = set(_weights(tmp_path))
    assert not any(n.startswith("bert.pooler.") for n in names)
    assert all(n.startswith(("bert.", "cls.", "classifier.")) for n in names)

    # (`bm.from_pretrained` gives the head itself: tests/models/test_models_bert_heads.py)
    with pytest.warns(UserWarning, match=r"which BertModel does not use"):
        model = bm.BertModel.from_pretrained(tmp_path)
    assert model.pooler is None
    ids = token_ids(2, (7,))
    with torch.no_grad():
        expected = reference.bert(torch.tensor(ids)[None]).last_hidden_state[0]
    hidden = boxwood.filter_jit(model)(jnp.asarray(ids))
    assert np.abs(np.asarray(hidden) - expected.numpy()).max() <= ATOL
    with pytest.raises(
        ValueError, match="this model's checkpoint had no pooler .*no pooled output"
    ):
        model.pooled(hidden)


def test_pooler_less_file_equals_save_pretrained_without_pooler(tmp_path):
    sp, _ = shared_tiny("bert")
    saved = _weights(sp)
    masked_lm = {
        f"bert.{k}": v for k, v in saved.items() if not k.startswith("pooler.")
    }
    masked_lm["cls.predictions.bias"] = np.zeros(97, np.float32)
    _write_layout(sp, tmp_path / "mlm", masked_lm)
    full = bm.BertModel.from_pretrained(sp)
    with pytest.warns(UserWarning, match=r"holds `cls\.predictions\.bias`, which"):
        model = bm.BertModel.from_pretrained(tmp_path / "mlm")
    assert_same_model(model, boxwood.tree_at(lambda m: m.pooler, full, None))
    # only part of the pooler is still an error, naming what is missing
    del masked_lm["bert.encoder.layer.0.output.dense.bias"]
    masked_lm["bert.pooler.dense.weight"] = saved["pooler.dense.weight"]
    _write_layout(sp, tmp_path / "half", masked_lm)
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"(?s)(?=.*pooler\.bias: missing)(?=.*encoder\.layer\.0\.output\.bias: missing)",
    ):
        bm.BertModel.from_pretrained(tmp_path / "half")


def test_bert_model_saved_back_without_pooler_reloads(tmp_path):
    sp, _ = shared_tiny("bert")
    saved = _weights(sp)
    no_pooler = {k: v for k, v in saved.items() if not k.startswith("pooler.")}
    _write_layout(sp, tmp_path / "np", no_pooler)
    model = bm.BertModel.from_pretrained(tmp_path / "np")
    bm.save_pretrained(model, tmp_path / "back")
    assert set(_weights(tmp_path / "back")) == set(no_pooler)
    assert_same_model(bm.BertModel.from_pretrained(tmp_path / "back"), model)


def test_llama_file_with_rotary_buffers(tmp_path):
    sp, reference = shared_tiny("llama")
    saved = _weights(sp)
    dim = reference.config.hidden_size // reference.config.num_attention_heads
    inv_freq = 1.0 / 10000 ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    for i in range(LAYERS):
        saved[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = inv_freq
    _write_layout(sp, tmp_path / "old", saved)
    assert_same_model(bm.from_pretrained(tmp_path / "old"), bm.from_pretrained(sp))


def test_a_file_fitting_no_layout_is_reported_by_save_pretrained_names(tmp_path):
    sp, _ = shared_tiny("gpt2")
    saved = _weights(sp)
    # both spellings of one tensor: neither layout reads the file as it is
    mixed = dict(saved)
    mixed["h.0.ln_1.weight"] = saved["transformer.h.0.ln_1.weight"]
    _write_layout(sp, tmp_path / "mixed", mixed)
    with pytest.raises(boxwood.CheckpointError, match=r"h\.0\.ln_1\.weight"):
        bm.from_pretrained(tmp_path / "mixed")


def test_pooler_less_bert_loads_onto_a_mesh(tmp_path):
    sp, _ = shared_tiny("bert")
    saved = _weights(sp)
    body = {f"bert.{k}": v for k, v in saved.items() if not k.startswith("pooler.")}
    _write_layout(sp, tmp_path / "mlm", body)
    mesh = boxwood.make_mesh((1, 1), ("data", "model"))
    model = bm.from_pretrained(tmp_path / "mlm", mesh=mesh, rules="tensor_parallel")
    assert model.pooler is None
    reference = bm.from_pretrained(tmp_path / "mlm")
    assert_same_model(model, reference)
