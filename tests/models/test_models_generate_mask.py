"""`boxwood.models.generate(..., attention_mask=...)`: a batch padded to one
length, as a tokenizer returns it (left or right padding), gives the rows of the
same prompts passed as a list (each row `transformers`' greedy `generate` of its
prompt alone); and the checks of the mask."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _hf_models import save_tiny, token_ids, torch
from _precision import highest_matmul_precision  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

LENGTHS = [7, 3, 12, 5]
WIDTH = 14  # wider than every prompt: every row has some padding
NEW = 10


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    options: dict[str, Any] = dict(initializer_range=0.3)  # varied continuations
    if request.param == "llama":
        options.update(num_key_value_heads=2, tie_word_embeddings=False)
    reference = save_tiny(request.param, directory, **options)
    return bm.from_pretrained(directory), reference


def _prompts():
    return [token_ids(seed, (n,)) for seed, n in enumerate(LENGTHS)]


def _padded(prompts, side, filler=0):
    """`(input_ids, attention_mask)` as a tokenizer pads them on `side`."""
    ids = np.full((len(prompts), WIDTH), filler, np.int64)
    mask = np.zeros((len(prompts), WIDTH), np.int64)
    for row, prompt in enumerate(prompts):
        cols = (
            slice(WIDTH - len(prompt), WIDTH) if side == "left" else slice(len(prompt))
        )
        ids[row, cols] = prompt
        mask[row, cols] = 1
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_the_list_of_prompts(pair, side):
    model, _ = pair
    prompts = _prompts()
    ids, mask = _padded(prompts, side)
    out = bm.generate(model, jnp.asarray(ids), NEW, attention_mask=jnp.asarray(mask))
    listed = bm.generate(model, prompts, NEW)
    assert out.shape == (len(prompts), max(LENGTHS) + NEW) and out.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out), np.asarray(listed))
    # nested lists and a boolean mask: the same
    again = bm.generate(model, ids.tolist(), NEW, attention_mask=mask.astype(bool))
    np.testing.assert_array_equal(np.asarray(again), np.asarray(listed))


def test_rows_equal_transformers_alone(pair):
    model, reference = pair
    prompts = _prompts()
    ids, mask = _padded(prompts, "right", filler=-100)  # ids under padding ignored
    out = np.asarray(bm.generate(model, ids, NEW, attention_mask=mask))
    longest = max(LENGTHS)
    for prompt, row in zip(prompts, out):
        with torch.no_grad():
            expected = reference.generate(
                torch.tensor(prompt)[None], max_new_tokens=NEW, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )[0].numpy()  # fmt: skip
        np.testing.assert_array_equal(row[longest - len(prompt) :], expected)


def test_one_prompt_with_a_mask(pair):
    model, _ = pair
    prompt = token_ids(9, (6,))
    ids = np.concatenate([[0, 0, 0], prompt])
    out = bm.generate(model, ids, NEW, attention_mask=[0, 0, 0, 1, 1, 1, 1, 1, 1])
    assert out.shape == (6 + NEW,)
    np.testing.assert_array_equal(
        np.asarray(out), np.asarray(bm.generate(model, prompt, NEW))
    )


def test_full_mask_is_the_plain_batch(pair):
    model, _ = pair
    batch = token_ids(7, (3, 9))
    out = bm.generate(model, batch, NEW, attention_mask=np.ones((3, 9), np.int32))
    np.testing.assert_array_equal(
        np.asarray(out), np.asarray(bm.generate(model, batch, NEW))
    )


def test_mask_errors(pair):
    model, _ = pair
    ids, mask = _padded(_prompts(), "left")
    with pytest.raises(ValueError, match=r"`attention_mask` must have the shape of"):
        bm.generate(model, ids, 2, attention_mask=mask[:, 1:])
    with pytest.raises(ValueError, match=r"`attention_mask` must have the shape of"):
        bm.generate(model, ids[None], 2, attention_mask=mask[None])
    two = mask.copy()
    two[2, -1] = 2
    with pytest.raises(ValueError, match=r"only 0 .* and 1 .*; row 2 holds 2"):
        bm.generate(model, ids, 2, attention_mask=two)
    with pytest.raises(ValueError, match=r"row 0 holds 0\.5"):
        bm.generate(model, ids, 2, attention_mask=np.where(mask == 0, 0.5, 1.0))
    empty = mask.copy()
    empty[3] = 0
    with pytest.raises(ValueError, match=r"row 3 of `attention_mask` is all 0"):
        bm.generate(model, ids, 2, attention_mask=empty)
    holes = mask.copy()
    holes[0, -3] = 0
    with pytest.raises(ValueError, match=r"ones of row 0 of `attention_mask` are not"):
        bm.generate(model, ids, 2, attention_mask=holes)
    ragged = [[5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match=r"needs no `attention_mask`"):
        bm.generate(model, ragged, 2, attention_mask=[[1, 1, 1], [1, 1]])


def test_mask_must_be_concrete_and_ids_checked(pair):
    model, _ = pair
    ids, mask = _padded(_prompts(), "left")
    traced = jax.jit(lambda m: bm.generate(model, ids, 2, attention_mask=m))
    with pytest.raises(TypeError, match=r"`attention_mask` must be concrete"):
        traced(mask)
    ids[1, -1] = model.config.vocab_size  # a real token out of the vocabulary
    with pytest.raises(ValueError, match=r"prompt 1: `input_ids` must hold token"):
        bm.generate(model, ids, 2, attention_mask=mask)
