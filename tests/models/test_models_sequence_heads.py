"""`GPT2ForSequenceClassification` and `LlamaForSequenceClassification` against
`transformers`: the logits read at
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


KINDS = {
    "gpt2": "GPT2ForSequenceClassification",
    "llama": "LlamaForSequenceClassification",
}
_PAIRS = {}


@pytest.fixture(scope="module", params=sorted(KINDS))
def scorer(request):
    """`(boxwood model, reference)`: a random `transformers` classifier of three
    labels, pad id 0, saved and read."""
    kind = request.param
    if kind not in _PAIRS:
        torch.manual_seed(0)
        pad = {"pad_token_id": 0} if kind == "gpt2" else {}  # (Llama's is 0)
        config = CONFIGS[kind](**WIDE, num_labels=3, **pad)
        reference = getattr(transformers, KINDS[kind])(config).eval()
        directory = scratch_directory(kind)
        reference.save_pretrained(str(directory))
        _PAIRS[kind] = bm.from_pretrained(directory), reference
    return _PAIRS[kind]


def test_matches_transformers_at_the_last_real_token(scorer):
    model, reference = scorer
    assert type(model).__name__ == type(reference).__name__
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
    with pytest.raises(ValueError, match=rf"{type(model).__name__}\.loss: `labels`"):
        model.loss(logits, np.array([2, 0, 3]))


def test_saved_back_loads_in_transformers_and_boxwood(scorer, tmp_path):
    model, reference = scorer
    model.save_pretrained(tmp_path)
    theirs = type(reference).from_pretrained(str(tmp_path))
    assert theirs.config.num_labels == 3
    mine, before = theirs.state_dict(), reference.state_dict()
    assert mine.keys() == before.keys()
    for name in mine:
        np.testing.assert_array_equal(mine[name].numpy(), before[name].numpy())
    again = bm.from_pretrained(tmp_path)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(model), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the language model reads the body, and names the head it drops (tied:
    # the file has no `lm_head`)
    language_model, options = {
        bm.GPT2ForSequenceClassification: (bm.GPT2LMHeadModel, {}),
        bm.LlamaForSequenceClassification: (
            bm.LlamaForCausalLM,
            {"tie_word_embeddings": True},
        ),
    }[type(model)]
    with pytest.warns(UserWarning, match=r"holds `score\.weight`, which .* dropped"):
        language_model.from_pretrained(tmp_path, **options)


def test_hidden_states_match_transformers(scorer):
    model, reference = scorer
    call = lambda ids: model(ids, output_hidden_states=True)
    logits, hidden = boxwood.filter_jit(jax.vmap(call))(IDS)
    with torch.no_grad():
        out = reference(input_ids=torch.tensor(IDS), output_hidden_states=True)
    expected = np.stack([h.numpy() for h in out.hidden_states], axis=1)
    assert hidden.shape == expected.shape == (3, 3, 7, 32)
    np.testing.assert_allclose(hidden, expected, atol=1e-4)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=1e-5)


def test_an_untied_language_model_draws_the_lm_head_a_classifier_file_lacks(
    tmp_path,
):
    """`LlamaForCausalLM` of an (untied) `LlamaForSequenceClassification` file:
    the body read, `lm_head` drawn anew and listed, `score` dropped and listed,
    as `transformers` loads it."""
    config = bm.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, tie_word_embeddings=False, initializer_range=0.5,
    )  # fmt: skip
    bm.LlamaForSequenceClassification(config, key=jax.random.key(0)).save_pretrained(
        tmp_path
    )
    with pytest.warns(
        UserWarning,
        match=r"has no `lm_head\.weight`; these parameters of LlamaForCausalLM's "
        r"head are newly initialised.*`score\.weight` are not used",
    ):
        model = bm.LlamaForCausalLM.from_pretrained(tmp_path)
    assert model.lm_head.weight.shape == (40, 16)
    assert 0.4 < float(np.std(model.lm_head.weight)) < 0.6  # `N(0, 0.5)`
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path))
    np.testing.assert_array_equal(
        theirs.model.embed_tokens.weight.detach().numpy(),
        np.asarray(model.model.embed_tokens.weight),
    )
