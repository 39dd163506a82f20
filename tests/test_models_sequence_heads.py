"""`GPT2ForSequenceClassification` against `transformers`: the logits read at
the last token that is not padding, the loss, the class chosen from the file's
`architectures`, and the round trip back through `transformers`."""

import jax
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import CONFIGS, WIDE, scratch_directory, token_ids, torch, transformers
from _precision import highest_matmul_precision  # noqa: F401

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

IDS = token_ids(5, (3, 7))
IDS[0, 5:] = 0  # right padding (`pad_token_id` 0)
IDS[1, 1] = 0  # a pad id inside a row is not the end: the last non-pad is


@pytest.fixture(scope="module")
def gpt2_scorer():
    torch.manual_seed(0)
    config = CONFIGS["gpt2"](**WIDE, num_labels=3, pad_token_id=0)
    reference = transformers.GPT2ForSequenceClassification(config).eval()
    directory = scratch_directory("gpt2-scorer")
    reference.save_pretrained(str(directory))
    return bm.from_pretrained(directory), reference


def test_matches_transformers_at_the_last_real_token(gpt2_scorer):
    model, reference = gpt2_scorer
    assert type(model) is bm.GPT2ForSequenceClassification
    mask = (IDS != 0).astype(np.int32)
    mask[1, 1] = 1
    logits = boxwood.filter_jit(jax.vmap(model))(IDS, mask)
    labels = np.array([2, 0, 1])
    with torch.no_grad():
        out = reference(
            input_ids=torch.tensor(IDS),
            attention_mask=torch.tensor(mask),
            labels=torch.tensor(labels),
        )
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(model.loss(logits, labels), out.loss.item(), rtol=1e-5)
    with pytest.raises(
        ValueError, match=r"GPT2ForSequenceClassification\.loss: `labels`"
    ):
        model.loss(logits, np.array([2, 0, 3]))


def test_saved_back_loads_in_transformers_and_boxwood(gpt2_scorer, tmp_path):
    model, reference = gpt2_scorer
    model.save_pretrained(tmp_path)
    theirs = transformers.GPT2ForSequenceClassification.from_pretrained(str(tmp_path))
    assert theirs.config.num_labels == 3
    mine, before = theirs.state_dict(), reference.state_dict()
    assert mine.keys() == before.keys()
    for name in mine:
        np.testing.assert_array_equal(mine[name].numpy(), before[name].numpy())
    again = bm.from_pretrained(tmp_path)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(model), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the language model reads the body, and names the head it drops
    with pytest.warns(
        UserWarning, match=r"holds `score\.weight`, which GPT2LMHeadModel"
    ):
        bm.GPT2LMHeadModel.from_pretrained(tmp_path)
