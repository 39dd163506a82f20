"""`resize_token_embeddings` against `transformers`' (`mean_resizing=False`):
the kept rows and the shapes of every vocabulary array (tied and untied output
projections, BERT's output bias), the config's `vocab_size`, the new rows'
distribution, the tie kept, and the resized model read back by `transformers`."""

import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _hf_models import CONFIGS, scratch_directory, shared_model, torch, transformers

UNTIED_LLAMA = dict(
    initializer_range=0.3, num_key_value_heads=2, tie_word_embeddings=False
)  # `generation_pair`'s Llama


@functools.cache
def _masked_lm():
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(CONFIGS["bert"]()).eval()
    directory = scratch_directory("masked-lm")
    reference.save_pretrained(str(directory))
    return bm.from_pretrained(directory), reference


PAIRS = {
    "gpt2": lambda: shared_model("gpt2"),
    "llama": lambda: shared_model("llama", **UNTIED_LLAMA),
    "bert": _masked_lm,
}


def _at(model, path):
    return functools.reduce(getattr, path.split("."), model)


def _theirs_resized(reference, size):
    theirs = copy.deepcopy(reference)  # the shared reference stays as it is
    theirs.resize_token_embeddings(size, mean_resizing=False)
    return theirs


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_kept_rows_and_shapes_match_transformers(kind):
    model, reference = PAIRS[kind]()
    paths = [p for p, _ in type(model).VOCABULARY if _at(model, p) is not None]
    assert len(paths) == {"gpt2": 1, "llama": 2, "bert": 2}[kind]
    for size in (120, 50):
        ours = model.resize_token_embeddings(size, key=jax.random.key(1))
        theirs = _theirs_resized(reference, size)
        assert ours.config.vocab_size == theirs.config.vocab_size == size
        kept = min(size, 97)
        for path in paths:
            mine = np.asarray(_at(ours, path))
            expected = theirs.get_parameter(path).detach().numpy()
            assert mine.shape == expected.shape, path
            np.testing.assert_array_equal(mine[:kept], expected[:kept])
            np.testing.assert_array_equal(mine[:kept], _at(model, path)[:kept])
            if path.endswith("bias"):  # the output bias grows with zeros
                np.testing.assert_array_equal(mine[kept:], expected[kept:])
    assert model.config.vocab_size == 97  # the model itself is unchanged


def test_a_tied_output_stays_tied_and_new_ids_are_read():
    model, _ = shared_model("gpt2")
    grown = model.resize_token_embeddings(120)
    table = grown.transformer.wte.weight
    assert grown.output_embedding() is table
    ids = jnp.array([5, 110, 119])  # new ids are valid inputs
    logits = grown(ids)
    assert logits.shape == (3, 120)
    np.testing.assert_allclose(
        logits[:, 110], grown.hidden_states(ids) @ table[110], rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ValueError, match="input_ids"):
        grown(jnp.array([5, 120]))
    masked, _ = _masked_lm()
    resized = masked.resize_token_embeddings(120)
    assert resized.bert.config.vocab_size == 120  # the body checks ids with it
    assert resized.cls.predictions.bias.shape == (120,)


def test_new_rows_are_drawn_as_the_family_draws_them():
    config = bm.LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, tie_word_embeddings=False, pad_token_id=100,
    )  # fmt: skip
    model = bm.LlamaForCausalLM(config, key=jax.random.key(0))
    grown = model.resize_token_embeddings(4016, key=jax.random.key(5))
    std = config.initializer_range
    for table in (grown.model.embed_tokens.weight, grown.lm_head.weight):
        new = np.asarray(table[16:])
        rows = np.delete(new, 100 - 16, axis=0)
        assert abs(rows.std() / std - 1) < 0.03 and abs(rows.mean()) < 0.03 * std
    # the padding row, new here, starts at zero as a padding index starts it
    assert not np.any(grown.model.embed_tokens.weight[100])
    assert np.any(grown.lm_head.weight[100])
    assert not np.allclose(
        grown.model.embed_tokens.weight[16:99], grown.lm_head.weight[16:99]
    )
    again = model.resize_token_embeddings(4016, key=jax.random.key(5))
    np.testing.assert_array_equal(again.lm_head.weight, grown.lm_head.weight)


def test_a_resized_model_is_read_back_by_transformers(tmp_path):
    model, _ = shared_model("llama", **UNTIED_LLAMA)
    grown = model.resize_token_embeddings(101, key=jax.random.key(2))
    grown.save_pretrained(tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path))
    assert theirs.config.vocab_size == 101
    np.testing.assert_array_equal(
        theirs.lm_head.weight.detach().numpy(), np.asarray(grown.lm_head.weight)
    )
    assert bm.from_pretrained(tmp_path).config.vocab_size == 101


def test_resize_errors():
    model, _ = shared_model("gpt2")
    with pytest.raises(ValueError, match=r"`new_num_tokens` must be at least 1, got 0"):
        model.resize_token_embeddings(0)
    with pytest.raises(TypeError, match=r"`new_num_tokens` must be an int .* got str"):
        model.resize_token_embeddings("120")
    vit = bm.ViTConfig(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=8, image_size=8, patch_size=4,
    )  # fmt: skip
    vit = bm.ViTForImageClassification(vit, key=jax.random.key(0))
    with pytest.raises(TypeError, match="has no token embeddings"):
        vit.resize_token_embeddings(10)
