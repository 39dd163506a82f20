"""`BertForQuestionAnswering`, `BertForMultipleChoice` and `BertForPreTraining`
against `transformers`: logits, hidden states and losses of random tiny models
saved with `save_pretrained`, the class chosen from the file's `architectures`,
and the round trip back through `transformers`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import CONFIGS, WIDE, scratch_directory, token_ids, torch, transformers
from _precision import highest_matmul_precision  # noqa: F401

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

# float32 through the layers against PyTorch's: logits of a few units agree to a
# few ulps of their scale, and which few depends on the CPU (its vector width)
TOL = 5e-5
IDS = token_ids(5, (2, 7))
MASK = np.array([[1, 1, 1, 1, 1, 0, 0], [1] * 7])
TYPES = np.array([[0, 0, 0, 1, 1, 1, 1], [0] * 7])
# two examples of three choices each
CHOICES = token_ids(6, (2, 3, 7))
CHOICE_MASK = np.ones((2, 3, 7), np.int64)
CHOICE_MASK[0, 1, 5:] = 0


def _pair(head):
    """`(boxwood model, reference)`: a random `transformers` head saved and read."""
    torch.manual_seed(0)
    reference = getattr(transformers, head)(CONFIGS["bert"](**WIDE)).eval()
    directory = scratch_directory(head)
    reference.save_pretrained(str(directory))
    return bm.from_pretrained(directory), reference


@pytest.fixture(scope="module")
def question_answering():
    return _pair("BertForQuestionAnswering")


@pytest.fixture(scope="module")
def multiple_choice():
    return _pair("BertForMultipleChoice")


@pytest.fixture(scope="module")
def pretraining():
    return _pair("BertForPreTraining")


def _spans(model):
    return boxwood.filter_jit(jax.vmap(model))(IDS, MASK, TYPES)


def test_question_answering_matches_transformers(question_answering):
    model, reference = question_answering
    assert type(model) is bm.BertForQuestionAnswering
    start, end = _spans(model)
    positions = dict(start_positions=np.array([1, 3]), end_positions=np.array([2, 6]))
    tensors = dict(input_ids=IDS, attention_mask=MASK, token_type_ids=TYPES)
    with torch.no_grad():
        out = reference(
            **{k: torch.tensor(v) for k, v in {**tensors, **positions}.items()}
        )
    np.testing.assert_allclose(start, out.start_logits.numpy(), atol=TOL)
    np.testing.assert_allclose(end, out.end_logits.numpy(), atol=TOL)
    loss = model.loss(start, end, *positions.values())
    np.testing.assert_allclose(loss, out.loss.item(), rtol=TOL)
    with pytest.raises(
        ValueError,
        match=r"BertForQuestionAnswering\.loss: `end_positions` must hold token "
        r"indices from 0 to 6 \(`seq` = 7\).*got 7 at position 1",
    ):
        model.loss(start, end, np.array([1, 3]), np.array([2, 7]))


def test_multiple_choice_matches_transformers(multiple_choice):
    model, reference = multiple_choice
    assert type(model) is bm.BertForMultipleChoice
    logits = boxwood.filter_jit(jax.vmap(model))(CHOICES, CHOICE_MASK)
    labels = np.array([2, 0])
    with torch.no_grad():
        out = reference(
            input_ids=torch.tensor(CHOICES),
            attention_mask=torch.tensor(CHOICE_MASK),
            labels=torch.tensor(labels),
        )
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=TOL)
    np.testing.assert_allclose(model.loss(logits, labels), out.loss.item(), rtol=TOL)
    with pytest.raises(
        ValueError, match=r"`labels` must hold choice indices from 0 to 2"
    ):
        model.loss(logits, np.array([3, 0]))
    with pytest.raises(
        ValueError, match=r"`input_ids` must have shape \(num_choices, seq\)"
    ):
        model(CHOICES[0, 0])


def _stacked(out):
    """`transformers`' tuple of hidden states as one array, layers second."""
    return np.stack([h.numpy() for h in out.hidden_states], axis=1)


def test_span_and_choice_heads_return_hidden_states(
    question_answering, multiple_choice
):
    model, reference = question_answering
    call = lambda *args: model(*args, output_hidden_states=True)
    (start, _), hidden = boxwood.filter_jit(jax.vmap(call))(IDS, MASK, TYPES)
    with torch.no_grad():
        out = reference(
            input_ids=torch.tensor(IDS),
            attention_mask=torch.tensor(MASK),
            token_type_ids=torch.tensor(TYPES),
            output_hidden_states=True,
        )
    real = MASK.astype(bool)[:, None, :, None]
    expected = _stacked(out)
    np.testing.assert_allclose(
        np.where(real, hidden, 0), np.where(real, expected, 0), atol=TOL
    )
    np.testing.assert_allclose(start, out.start_logits.numpy(), atol=TOL)
    model, reference = multiple_choice
    call = lambda *args: model(*args, output_hidden_states=True)
    logits, hidden = boxwood.filter_jit(jax.vmap(call))(CHOICES, CHOICE_MASK)
    with torch.no_grad():
        out = reference(
            input_ids=torch.tensor(CHOICES),
            attention_mask=torch.tensor(CHOICE_MASK),
            output_hidden_states=True,
        )
    # (examples, layers, choices, seq, width); `transformers` folds the choices
    # into the batch
    assert hidden.shape == (2, 3, 3, 7, 32)
    expected = _stacked(out).reshape(2, 3, 3, 7, 32).transpose(0, 2, 1, 3, 4)
    real = CHOICE_MASK.astype(bool)[:, None, :, :, None]
    np.testing.assert_allclose(
        np.where(real, hidden, 0), np.where(real, expected, 0), atol=TOL
    )
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=TOL)


def test_pretraining_matches_transformers(pretraining):
    model, reference = pretraining
    assert type(model) is bm.BertForPreTraining
    call = lambda *args: model(*args, output_hidden_states=True)
    (words, sentences), hidden = boxwood.filter_jit(jax.vmap(call))(IDS, MASK, TYPES)
    labels = np.full(IDS.shape, -100)
    labels[0, 1], labels[1, 4] = 7, 50  # two masked tokens
    follows = np.array([1, 0])
    inputs = dict(input_ids=IDS, attention_mask=MASK, token_type_ids=TYPES)
    with torch.no_grad():
        out = reference(
            **{k: torch.tensor(v) for k, v in inputs.items()},
            labels=torch.tensor(labels),
            next_sentence_label=torch.tensor(follows),
            output_hidden_states=True,
        )
    real = MASK.astype(bool)
    np.testing.assert_allclose(
        words[real], out.prediction_logits.numpy()[real], atol=TOL
    )
    np.testing.assert_allclose(sentences, out.seq_relationship_logits.numpy(), atol=TOL)
    at_real = real[:, None, :, None]
    np.testing.assert_allclose(
        np.where(at_real, hidden, 0), np.where(at_real, _stacked(out), 0), atol=TOL
    )
    loss = model.loss(words, sentences, labels, follows)
    np.testing.assert_allclose(loss, out.loss.item(), rtol=TOL)
    with pytest.raises(
        ValueError,
        match=r"BertForPreTraining\.loss: `next_sentence_label` must hold "
        r"next-sentence labels .* from 0 to 1",
    ):
        model.loss(words, sentences, labels, np.array([2, 0]))


_HEADS = ["BertForQuestionAnswering", "BertForMultipleChoice", "BertForPreTraining"]


@pytest.mark.parametrize("head", _HEADS)
def test_saved_back_loads_in_transformers_and_boxwood(
    question_answering, multiple_choice, pretraining, head, tmp_path
):
    model, original = dict(
        zip(_HEADS, (question_answering, multiple_choice, pretraining))
    )[head]
    model.save_pretrained(tmp_path)
    theirs = getattr(transformers, head).from_pretrained(str(tmp_path)).eval()
    assert theirs.state_dict().keys() == original.state_dict().keys()
    for mine, before in zip(
        theirs.state_dict().values(), original.state_dict().values()
    ):
        np.testing.assert_array_equal(mine.numpy(), before.numpy())
    again = bm.from_pretrained(tmp_path)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(model), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_training_choice_model_draws_dropout_per_choice():
    config = bm.BertConfig(32, 8, 1, 2, 16, max_position_embeddings=8)
    model = bm.BertForMultipleChoice(config, key=jax.random.key(0))
    ids = jnp.asarray(token_ids(1, (3, 5), vocab=32))
    with pytest.raises(RuntimeError, match=r"needs a random key"):
        jax.eval_shape(model, ids)
    call = boxwood.filter_jit(lambda m, k: m(ids, key=k))
    a = call(model, jax.random.key(1))
    assert a.shape == (3,) and not np.allclose(a, call(model, jax.random.key(2)))
    with pytest.raises(bm.ConfigError, match="`num_labels` must be 2"):
        bm.BertForQuestionAnswering(bm.BertConfig(num_labels=3), key=jax.random.key(0))


def test_pretraining_files_and_the_masked_lm_read_each_other(pretraining, tmp_path):
    """The masked LM reads a pre-training file, dropping (and naming) the
    next-sentence head and the pooler; the pre-training model reads a masked
    LM's file, drawing them."""
    model, _ = pretraining
    model.save_pretrained(tmp_path / "both")
    with pytest.warns(
        UserWarning, match=r"holds `bert\.pooler\.dense\.bias`.*`cls\.seq_relationship"
    ):
        masked = bm.BertForMaskedLM.from_pretrained(tmp_path / "both")
    np.testing.assert_array_equal(
        masked.cls.predictions.bias, model.cls.predictions.bias
    )
    masked.save_pretrained(tmp_path / "masked")
    with pytest.warns(
        UserWarning, match=r"has no `bert\.pooler\.dense\.bias`.*newly initialised"
    ):
        again = bm.BertForPreTraining.from_pretrained(tmp_path / "masked")
    assert again.cls.seq_relationship.weight.shape == (2, 32)
    np.testing.assert_array_equal(
        again.cls.predictions.transform.dense.weight,
        model.cls.predictions.transform.dense.weight,
    )
