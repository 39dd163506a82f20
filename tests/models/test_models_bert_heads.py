"""BERT's task heads (`BertForMaskedLM`, `BertForSequenceClassification`,
`BertForTokenClassification`) against `transformers`: logits and losses of
random tiny models saved with `save_pretrained`, the class chosen from the file's
`architectures`, the round trip back, the label options, sharding rules."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

import boxwood
import boxwood.models as bm
from _hf_models import (
    CONFIGS,
    WIDE,
    copy_checkpoint,
    scratch_directory,
    token_ids,
    torch,
    transformers,
)
from _precision import highest_matmul_precision  # noqa: F401

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

TOL = 1e-4
HEADS = (
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
)
# one sequence of 7 tokens, the last two padding, two segments
IDS = token_ids(5, (2, 7))
MASK = np.array([[1, 1, 1, 1, 1, 0, 0], [1] * 7])
TYPES = np.array([[0, 0, 0, 1, 1, 1, 1], [0] * 7])


def _saved(head, **options):
    """`(directory, reference)`: a random `transformers` head saved there."""
    torch.manual_seed(0)
    config = CONFIGS["bert"](**WIDE, **options)
    reference = getattr(transformers, head)(config).eval()
    directory = scratch_directory(head)
    reference.save_pretrained(str(directory))
    return directory, reference


@pytest.fixture(scope="module")
def heads():
    """Each head, three labels for the classifiers: `(directory, reference,
    boxwood model)`."""
    out = {}
    for head in HEADS:
        options = {} if head == "BertForMaskedLM" else {"num_labels": 3}
        directory, reference = _saved(head, **options)
        out[head] = directory, reference, bm.from_pretrained(directory)
    return out


def _theirs(reference, **labels):
    with torch.no_grad():
        return reference(
            input_ids=torch.tensor(IDS),
            attention_mask=torch.tensor(MASK),
            token_type_ids=torch.tensor(TYPES),
            **labels,
        )


# one compiled program per model (class and config), shared by the tests
_batch = boxwood.filter_jit(lambda model, *args: jax.vmap(model)(*args))


def _ours(model):
    return _batch(model, IDS, MASK, TYPES)


@pytest.mark.parametrize("head", HEADS)
def test_head_matches_transformers(heads, head):
    directory, reference, model = heads[head]
    assert type(model).__name__ == head
    assert type(bm.from_pretrained(directory)) is type(model)
    expected = _theirs(reference).logits.numpy()
    ours = np.asarray(_ours(model))
    assert ours.shape == expected.shape
    assert np.abs(ours - expected).max() <= TOL


def _stacked(hidden_states):
    """`transformers`' tuple of hidden states as one `(batch, layers, ...)` array."""
    return np.stack([h.numpy() for h in hidden_states], axis=1)


@pytest.mark.parametrize("head", HEADS)
def test_head_returns_every_layers_hidden_states(heads, head):
    _, reference, model = heads[head]
    call = lambda *args: model(*args, output_hidden_states=True)
    logits, hidden = boxwood.filter_jit(jax.vmap(call))(IDS, MASK, TYPES)
    with torch.no_grad():
        theirs = reference(
            input_ids=torch.tensor(IDS),
            attention_mask=torch.tensor(MASK),
            token_type_ids=torch.tensor(TYPES),
            output_hidden_states=True,
        )
    expected = _stacked(theirs.hidden_states)
    assert hidden.shape == expected.shape == (2, 3, 7, 32)
    real = MASK.astype(bool)[:, None, :, None]  # padding positions unspecified
    np.testing.assert_allclose(
        np.where(real, hidden, 0), np.where(real, expected, 0), atol=TOL
    )
    assert np.abs(np.asarray(logits) - theirs.logits.numpy()).max() <= TOL


@pytest.mark.parametrize("head", HEADS)
def test_head_saved_back_loads_in_transformers_and_boxwood(heads, head, tmp_path):
    directory, reference, model = heads[head]
    bm.save_pretrained(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [head]
    original = json.loads((directory / "config.json").read_text())
    for name in ("id2label", "label2id", "classifier_dropout"):
        assert written.get(name) == original.get(name), name
    again = getattr(transformers, head).from_pretrained(tmp_path).eval()
    assert again.config.id2label == reference.config.id2label
    expected = _theirs(again).logits.numpy()
    assert np.abs(np.asarray(_ours(model)) - expected).max() <= TOL
    reloaded = bm.from_pretrained(tmp_path)
    assert type(reloaded) is type(model) and reloaded.config == model.config


def test_masked_lm_decodes_with_the_word_embeddings(heads):
    directory, _, model = heads["BertForMaskedLM"]
    # the decoder is the body's table: no weight of its own, and changing the
    # table changes the logits
    assert not hasattr(model.cls.predictions, "decoder")
    table = model.bert.embeddings.word_embeddings.weight
    doubled = boxwood.tree_at(
        lambda m: m.bert.embeddings.word_embeddings.weight, model, 2 * table
    )
    assert not np.allclose(_ours(doubled), _ours(model))


def test_masked_lm_loss_matches_transformers(heads):
    _, reference, model = heads["BertForMaskedLM"]
    labels = np.full(IDS.shape, -100)
    labels[0, 1], labels[0, 3], labels[1, 6] = 7, 50, 3  # three masked tokens
    expected = _theirs(reference, labels=torch.tensor(labels)).loss.item()
    ours = model.loss(_ours(model), jnp.asarray(labels))
    assert abs(float(ours) - expected) <= TOL


def test_token_classification_loss_matches_transformers(heads):
    _, reference, model = heads["BertForTokenClassification"]
    labels = np.random.RandomState(0).randint(0, 3, IDS.shape)
    labels[0, 5:] = -100  # the padding
    expected = _theirs(reference, labels=torch.tensor(labels)).loss.item()
    ours = model.loss(_ours(model), jnp.asarray(labels))
    assert abs(float(ours) - expected) <= TOL


def _sequence_losses(reference, model, labels):
    reference.config.problem_type = None  # `transformers` sets it on a first call
    expected = _theirs(reference, labels=torch.tensor(labels)).loss.item()
    chosen = reference.config.problem_type
    return float(model.loss(_ours(model), jnp.asarray(labels))), expected, chosen


def test_sequence_classification_loss_chooses_as_transformers(heads):
    _, reference, model = heads["BertForSequenceClassification"]
    single = np.array([2, 0])
    ours, theirs, chosen = _sequence_losses(reference, model, single)
    assert chosen == "single_label_classification" and abs(ours - theirs) <= TOL
    multi = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    ours, theirs, chosen = _sequence_losses(reference, model, multi)
    assert chosen == "multi_label_classification" and abs(ours - theirs) <= TOL


def test_regression_loss_with_one_label():
    directory, reference = _saved("BertForSequenceClassification", num_labels=1)
    model = bm.from_pretrained(directory)
    targets = np.array([0.5, -1.5], np.float32)
    ours, theirs, chosen = _sequence_losses(reference, model, targets)
    assert chosen == "regression" and abs(ours - theirs) <= TOL
    # an explicit `problem_type` wins over the choice by dtype
    copy = copy_checkpoint(directory, scratch_directory("problem"))
    config = json.loads((copy / "config.json").read_text())
    config.update(problem_type="regression", num_labels=3)
    del config["id2label"], config["label2id"]  # (else they disagree: an error)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(boxwood.CheckpointError, match="classifier.weight"):
        bm.from_pretrained(copy)  # three labels: the file's classifier has one


def test_label_options_read_and_written_back(tmp_path):
    config = bm.BertConfig.from_dict({"num_labels": 4, "problem_type": "regression"})
    assert config.labels == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    options = config.to_dict()
    assert options["id2label"]["3"] == "LABEL_3" and options["label2id"]["LABEL_0"] == 0
    assert options["problem_type"] == "regression" and "num_labels" not in options
    named = bm.BertConfig.from_dict({"id2label": {"1": "pos", "0": "neg"}})
    assert named.labels == ("neg", "pos") and named.num_labels == 2
    assert "id2label" not in bm.BertConfig().to_dict()  # the default two labels
    with pytest.raises(bm.ConfigError, match="`problem_type` = 'ranking' is not one"):
        bm.BertConfig.from_dict({"problem_type": "ranking"})
    with pytest.raises(
        bm.ConfigError, match="`classifier_dropout` = 1.5 is a dropout probability"
    ):
        bm.BertConfig.from_dict({"classifier_dropout": 1.5})


def test_classifier_dropout_falls_back_to_hidden_dropout():
    key = jax.random.key(0)
    config = bm.BertConfig(50, 8, 1, 2, 16, hidden_dropout_prob=0.3)
    model = bm.BertForTokenClassification(config, key=key)
    assert model.dropout.p == 0.3
    config = bm.BertConfig(50, 8, 1, 2, 16, classifier_dropout=0.6)
    assert bm.BertForSequenceClassification(config, key=key).dropout.p == 0.6


def test_untied_masked_lm_is_refused():
    config = bm.BertConfig(50, 8, 1, 2, 16, extra={"tie_word_embeddings": False})
    with pytest.raises(bm.ConfigError, match="`tie_word_embeddings` = false"):
        bm.BertForMaskedLM(config, key=jax.random.key(0))


def test_loss_argument_errors(heads):
    model = heads["BertForTokenClassification"][2]
    logits = jnp.zeros((7, 3))
    with pytest.raises(ValueError, match=r"`labels` \(class ids\) must have shape"):
        model.loss(logits, jnp.zeros((6,), jnp.int32))
    with pytest.raises(TypeError, match="takes integer class ids"):
        model.loss(logits, jnp.zeros((7,)))


@pytest.mark.parametrize(
    "cls",
    [
        bm.BertForMaskedLM,
        bm.BertForSequenceClassification,
        bm.BertForTokenClassification,
    ],
)
def test_heads_take_berts_tensor_parallel_rules(cls):
    config = bm.BertConfig(10, 16, 1, 4, 32, max_position_embeddings=8)
    abstract = boxwood.filter_eval_shape(cls, config, key=jax.random.key(0))
    mesh = AbstractMesh((2, 4), ("data", "model"))
    plan = boxwood.sharding_plan(abstract, mesh, bm.sharding_rules(cls), show=False)
    split = {row.path for row in plan.rows if "model" in str(row.spec)}
    layer = "bert.encoder.layer.layers."
    assert {
        layer + "attention.attn.query_proj.weight",
        layer + "intermediate.weight",
        layer + "output.weight",
        "bert.embeddings.word_embeddings.weight",
    } <= split
    assert not any("classifier" in p or "predictions" in p for p in split)
