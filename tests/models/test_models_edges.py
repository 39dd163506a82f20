"""Edges of the causal LMs: a GPT-2 file that also holds its tied `lm_head.weight`,
empty ids and Python lists of ids, `generation_config.json`'s end and pad tokens,
and Gemma's `hidden_activation`."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import boxwood
import boxwood.models as bm
from _hf_models import copy_checkpoint, shared_model, shared_tiny, transformers


def _with_lm_head(tmp_path, head):
    directory = copy_checkpoint(shared_tiny("gpt2")[0], tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["lm_head.weight"] = head(tensors["transformer.wte.weight"])
    (directory / "model.safetensors").unlink()  # a hard link: replaced, not written
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def test_a_gpt2_file_with_its_tied_lm_head_loads(tmp_path):
    model = bm.from_pretrained(_with_lm_head(tmp_path, lambda w: w.copy()))
    plain, _ = shared_model("gpt2")
    np.testing.assert_array_equal(
        np.asarray(model.output_embedding()), np.asarray(plain.output_embedding())
    )


def test_a_gpt2_file_with_another_lm_head_is_refused(tmp_path):
    directory = _with_lm_head(tmp_path, lambda w: w + 1)
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`lm_head.weight` differs from `transformer.wte.weight`, but "
        r"GPT2LMHeadModel ties them",
    ):
        bm.from_pretrained(directory)


def test_empty_ids_and_lists_of_ids_as_generate_takes_them():
    model, _ = shared_model("gpt2")
    with pytest.raises(
        ValueError, match=r"GPT2LMHeadModel: `input_ids` is empty; give"
    ):
        model(jnp.zeros((0,), jnp.int32))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel: `input_ids` is empty"):
        model([])
    with pytest.raises(ValueError, match=r"`generate`: `input_ids` is empty; give"):
        bm.generate(model, np.zeros((0,), np.int32), 2)
    with pytest.raises(ValueError, match=r"`causal_lm_loss`: `input_ids` is empty"):
        bm.causal_lm_loss(model, [[]])
    ids = [5, 9, 11, 4]
    np.testing.assert_array_equal(
        np.asarray(model(ids)), np.asarray(model(jnp.asarray(ids)))
    )
    assert model.hidden_states(ids).shape == (4, 32)
    # compiled (op by op, each small operation compiles on its own); the nested
    # list reaches `causal_lm_loss` as it is, a static argument
    loss = boxwood.filter_jit(bm.causal_lm_loss)(model, [ids, ids])
    assert np.isfinite(float(loss))


def test_generation_config_gives_the_default_end_and_pad_tokens(tmp_path):
    directory = copy_checkpoint(shared_tiny("gpt2")[0], tmp_path / "in")
    model, _ = shared_model("gpt2")
    ids = jnp.asarray([5, 9, 11])
    # (`transformers` wrote a generation config with its end token, 2)
    assert model.config.generation_config["eos_token_id"] == 2
    free = np.asarray(bm.generate(model, ids, 6))
    assert 2 not in free[3:]  # so no early stop here
    end = int(free[4])  # the second new token: the loop must stop after it
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": end, "pad_token_id": 7, "max_length": 20})
    )
    loaded = bm.from_pretrained(directory)
    assert loaded.config.generation_config == {
        "eos_token_id": end, "pad_token_id": 7, "max_length": 20,
    }  # fmt: skip
    out = np.asarray(bm.generate(loaded, ids, 6))
    first = list(free[3:]).index(end) + 3
    np.testing.assert_array_equal(out[: first + 1], free[: first + 1])
    assert (out[first + 1 :] == 7).all()
    # an explicit argument still wins; `None` is no end token, as in `transformers`
    np.testing.assert_array_equal(
        np.asarray(bm.generate(loaded, ids, 6, eos_token_id=None)), free
    )
    # written back beside `config.json`, and readable by `transformers`
    bm.save_pretrained(loaded, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert written == {"eos_token_id": end, "pad_token_id": 7, "max_length": 20}
    reference = transformers.GenerationConfig.from_pretrained(tmp_path / "out")
    assert reference.eos_token_id == end and reference.pad_token_id == 7
    # not an option of `config.json`
    assert "generation_config" not in loaded.config.to_dict()
    # a model built from a config writes its config's token ids, as
    # `transformers` writes them for a model it built
    config = bm.GPT2Config(n_embd=8, n_head=2, n_layer=1, eos_token_id=3)
    built = bm.GPT2LMHeadModel(config, key=jax.random.key(0))
    bm.save_pretrained(built, tmp_path / "built")
    written = json.loads((tmp_path / "built" / "generation_config.json").read_text())
    assert written == {"_from_model_config": True, "eos_token_id": 3}
    reference = transformers.GenerationConfig.from_pretrained(tmp_path / "built")
    assert reference.eos_token_id == 3 and reference.bos_token_id is None
    reloaded = bm.from_pretrained(tmp_path / "built")
    assert reloaded.config.generation_config == written
    # a model that does not generate writes none, as in `transformers`
    bm.save_pretrained(shared_model("bert")[0], tmp_path / "none")
    assert not (tmp_path / "none" / "generation_config.json").exists()


@pytest.mark.parametrize("value", ["gelu", "gelu_pytorch_tanh"])
def test_gemma_hidden_activation_gelu_is_the_tanh_gelu(value):
    config = bm.GemmaConfig.from_dict({"hidden_activation": value})
    assert config.hidden_act == "gelu_pytorch_tanh"
    assert config.to_dict()["hidden_activation"] == value
    built = transformers.GemmaForCausalLM(
        transformers.GemmaConfig(
            num_hidden_layers=1, hidden_size=16, intermediate_size=32,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            vocab_size=16, hidden_activation=value,
        )
    )  # fmt: skip
    assert type(built.model.layers[0].mlp.act_fn).__name__ == "GELUTanh"
