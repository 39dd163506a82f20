"""Bad input to `boxwood.models`: each error names the file, option or argument."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import shared_model, shared_tiny, torch
from boxwood.models._checkpoint_files import INDEX, SINGLE


@pytest.fixture(scope="module")
def gpt2_dir():
    return shared_tiny("gpt2")[0]


@pytest.fixture(scope="module")
def gpt2():
    return shared_model("gpt2")[0]


# one compiled forward for every model and input of this module
_forward = boxwood.filter_jit(lambda model, ids: model(ids))


def _copy_with_config(src, dst, **changes):
    os.makedirs(dst, exist_ok=True)
    options = json.loads((src / "config.json").read_text())
    options.update(changes)
    (dst / "config.json").write_text(json.dumps(options))
    os.link(src / SINGLE, dst / SINGLE)
    return dst


def test_directory_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(
        bm.ConfigError, match=r"has no `config.json`.*holds: weights.bin"
    ):
        bm.from_pretrained(tmp_path)
    with pytest.raises(bm.ConfigError, match="no such directory.*never downloads"):
        bm.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")


def test_directory_without_safetensors(gpt2_dir, tmp_path):
    (tmp_path / "config.json").write_bytes((gpt2_dir / "config.json").read_bytes())
    with pytest.raises(bm.ConfigError, match=f"neither `{SINGLE}` nor `{INDEX}`"):
        bm.from_pretrained(tmp_path)


def test_unsupported_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(
        bm.ConfigError,
        match=r"config.json: `model_type` = 't5' .* supported: bert, gemma, gpt2, llama, mistral, qwen2, vit",
    ):
        bm.from_pretrained(tmp_path)


def test_class_for_another_model_type(gpt2_dir):
    with pytest.raises(
        bm.ConfigError,
        match="`model_type` is 'gpt2', but boxwood.models.LlamaForCausalLM reads 'llama'",
    ):
        bm.LlamaForCausalLM.from_pretrained(gpt2_dir)


def test_unknown_option_is_named(gpt2_dir, tmp_path):
    _copy_with_config(gpt2_dir, tmp_path, new_fancy_option=3)
    with pytest.raises(
        bm.ConfigError,
        match=r"config.json: the option `new_fancy_option` \(= 3\) is not supported",
    ):
        bm.from_pretrained(tmp_path)


def test_unsupported_value_is_named(gpt2_dir, tmp_path):
    _copy_with_config(gpt2_dir, tmp_path, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(
        bm.ConfigError,
        match="`scale_attn_by_inverse_layer_idx` = True is not supported",
    ):
        bm.from_pretrained(tmp_path)
    with pytest.raises(
        bm.ConfigError, match="`activation_function` = 'mish' is not supported"
    ):
        bm.GPT2Config.from_dict({"activation_function": "mish"})
    with pytest.raises(
        bm.ConfigError, match="`rope_parameters`: `rope_type` = 'yarn' is not supported"
    ):
        bm.LlamaConfig.from_dict(
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}
        )
    with pytest.raises(
        bm.ConfigError,
        match="`position_embedding_type` = 'relative_key' is not supported",
    ):
        bm.BertConfig.from_dict({"position_embedding_type": "relative_key"})


def test_missing_and_misshaped_tensors_listed_at_once(gpt2_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(gpt2_dir / SINGLE)
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    tensors["transformer.ln_f.weight"] = np.ones(31, np.float32)
    tensors["transformer.extra"] = np.ones(2, np.float32)
    save_file(tensors, tmp_path / SINGLE)
    (tmp_path / "config.json").write_bytes((gpt2_dir / "config.json").read_bytes())
    with pytest.raises(boxwood.CheckpointError, match="3 problems") as info:
        bm.from_pretrained(tmp_path)
    text = str(info.value)
    assert str(tmp_path) in text
    assert "transformer.h.1.mlp.c_fc.bias: missing from the checkpoint" in text
    assert (
        "transformer.ln_f.weight: checkpoint has f32[31], model expects f32[32]" in text
    )
    assert "transformer.extra: in the checkpoint but not in the model" in text


def test_bad_input_ids(gpt2):
    model = gpt2
    with pytest.raises(
        TypeError, match="GPT2LMHeadModel: `input_ids` must be an integer array"
    ):
        model(jnp.zeros(3))
    with pytest.raises(
        ValueError, match=r"`input_ids` must have shape \(seq,\).*got shape \(2, 3\)"
    ):
        model(jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(
        ValueError,
        match="`input_ids` has 65 tokens, more than the model's 64 positions",
    ):
        model(jnp.zeros(65, jnp.int32))


@pytest.mark.parametrize("bad", [97, 600, -1])
def test_out_of_vocabulary_ids_raise_eagerly(gpt2, bad):
    model = gpt2
    match = (
        r"GPT2LMHeadModel: `input_ids` must hold token ids from 0 to 96 \(the "
        rf"vocabulary has 97 tokens, `vocab_size` in the config\); got {bad} at "
        r"position 1 \(1 out of range"
    )
    with pytest.raises(ValueError, match=match):
        model(jnp.asarray([3, bad, 5]))
    if bad == 97:  # once: both ends of the vocabulary are fine
        model(jnp.asarray([0, 96]))


@pytest.mark.parametrize("bad", [97, -1])
def test_out_of_vocabulary_ids_raise_under_jit(gpt2, bad):
    model, call = gpt2, _forward
    with pytest.raises(
        boxwood.BoxwoodRuntimeError,
        match=r"GPT2LMHeadModel: `input_ids` must hold token ids from 0 to 96 "
        r"\(the vocabulary has 97 tokens.*got an id outside that range",
    ):
        call(model, jnp.asarray([3, bad, 5])).block_until_ready()
    assert call(model, jnp.asarray([0, 96])).shape == (2, 97)


def test_causal_lm_loss_checks_the_ids_once(gpt2):
    """Without `labels` the targets are the ids, which the model checks itself:
    the traced loss holds that one check (a conditional and a host callback in
    the program), with `labels` a second one for them; an id outside the
    vocabulary still raises the model's error."""

    def checks(**labels):
        loss = lambda ids: bm.causal_lm_loss(gpt2, ids, **labels)
        return str(jax.make_jaxpr(loss)(ids)).count("pure_callback")

    ids = jnp.asarray([[3, 5, 7]])
    assert checks() == 1
    assert checks(labels=ids) == 2
    with pytest.raises(
        boxwood.BoxwoodRuntimeError,
        match=r"GPT2LMHeadModel: `input_ids` must hold token ids from 0 to 96 ",
    ):
        boxwood.filter_jit(bm.causal_lm_loss)(gpt2, jnp.asarray([[3, 97, 5]]))


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_out_of_vocabulary_ids_other_families(kind):
    model, _ = shared_model(kind)
    name = type(model).__name__
    with pytest.raises(ValueError, match=f"{name}: `input_ids` must hold token ids"):
        model(jnp.asarray([3, 97]))
    with pytest.raises(
        boxwood.BoxwoodRuntimeError, match=f"{name}: `input_ids` must hold token ids"
    ):
        _forward(model, jnp.asarray([-1, 3]))


def test_bad_bert_and_vit_inputs():
    bert, _ = shared_model("bert")
    ids = jnp.zeros(4, jnp.int32)
    with pytest.raises(
        ValueError, match=r"`attention_mask` must have the shape of `input_ids`, \(4,\)"
    ):
        bert(ids, jnp.ones(5, jnp.int32))
    with pytest.raises(
        TypeError, match="`token_type_ids` must be an integer or boolean array"
    ):
        bert(ids, None, jnp.zeros(4))
    with pytest.raises(ValueError, match="BertModel: `input_ids` has 65 tokens"):
        bert(jnp.zeros(65, jnp.int32))
    vit, _ = shared_model("vit")
    with pytest.raises(
        ValueError, match=r"`pixel_values` must have shape \(3, 16, 16\)"
    ):
        vit(jnp.zeros((3, 32, 32)))
    with pytest.raises(
        TypeError, match="`pixel_values` must be a floating-point array"
    ):
        vit(jnp.zeros((3, 16, 16), jnp.int32))


def test_save_pretrained_takes_models_only(tmp_path):
    with pytest.raises(
        TypeError, match="`save_pretrained` takes a model of `boxwood.models`"
    ):
        bm.save_pretrained({"w": jnp.ones(2)}, tmp_path)


def test_boxwood_never_imports_torch_or_transformers():
    import subprocess
    import sys

    from _child_flags import child_env

    code = (
        "import sys, boxwood.models; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=child_env(),
    )
    assert out.stdout.strip() == "[]"
    assert torch is not None  # the tests themselves use it
