"""The labels of every loss of `boxwood.models`: class ids outside `[0, n)`
other than -100 raise (eagerly, under `boxwood.filter_jit`, and readably under a
plain `jax.jit`), and a batch whose every label is -100 gives 0."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _tiny_causal_lms import gpt2

BERT = bm.BertConfig(50, 8, 1, 2, 16, max_position_embeddings=8, labels=tuple("abc"))
VIT = bm.ViTConfig(
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    image_size=4,
    patch_size=2,
    labels=tuple("abc"),
)


@functools.cache
def _model(name):
    key = jax.random.key(0)
    if name == "ViTForImageClassification":
        return bm.ViTForImageClassification(VIT, key=key)
    return getattr(bm, name)(BERT, key=key)


def _sequence_loss(logits, labels):
    return _model("BertForSequenceClassification").loss(logits, labels)


def _token_loss(logits, labels):
    return _model("BertForTokenClassification").loss(logits, labels)


def _masked_lm_loss(logits, labels):
    return _model("BertForMaskedLM").loss(logits, labels)


def _vit_loss(logits, labels):
    return _model("ViTForImageClassification").loss(logits, labels)


def _causal_lm_loss(logits, labels):
    """`causal_lm_loss` of the tiny GPT-2 (vocabulary 97); `logits` gives only
    the shape (its token ids are all 3)."""
    return bm.causal_lm_loss(gpt2(), jnp.full(labels.shape, 3), labels)


# each loss, the size of its class axis, and the name of that size in the message
LOSSES = {
    "sequence": (_sequence_loss, 3, "class ids from 0 to 2 \\(`num_labels` = 3\\)"),
    "token": (_token_loss, 3, "class ids from 0 to 2 \\(`num_labels` = 3\\)"),
    "masked_lm": (_masked_lm_loss, 50, "token ids from 0 to 49 \\(`vocab_size` = 50"),
    "vit": (_vit_loss, 3, "class ids from 0 to 2 \\(`num_labels` = 3\\)"),
    "causal_lm": (_causal_lm_loss, 97, "token ids from 0 to 96 \\(`vocab_size` = 97"),
}


def _inputs(classes, labels):
    labels = jnp.asarray(labels, jnp.int32)
    return jnp.zeros((*labels.shape, classes)), labels


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("bad", ["minus_one", "num_labels"])
def test_labels_outside_the_classes_raise_eagerly(name, bad):
    loss, classes, rule = LOSSES[name]
    value = -1 if bad == "minus_one" else classes
    logits, labels = _inputs(classes, [[1, 0, 1], [0, value, 1]])
    with pytest.raises(
        ValueError,
        match=f"`labels` must hold {rule}.*or -100 for a position left out of the "
        f"loss; got {value} at position \\(1, 1\\) \\(1 out of range in all\\)\\. "
        "Set the label of an example without one \\(a GLUE test split's -1\\) to -100",
    ):
        loss(logits, labels)


@pytest.mark.parametrize("name", LOSSES)
def test_labels_outside_the_classes_raise_under_filter_jit(name):
    loss, classes, rule = LOSSES[name]
    logits, labels = _inputs(classes, [[1, 0, 1], [0, -1, 1]])
    with pytest.raises(
        boxwood.BoxwoodRuntimeError,
        match=f"`labels` must hold {rule}.*; got a label outside that range",
    ):
        boxwood.filter_jit(loss)(logits, labels)


@pytest.mark.parametrize("name", LOSSES)
def test_every_label_ignored_gives_zero(name):
    loss, classes, _ = LOSSES[name]
    logits, labels = _inputs(classes, np.full((2, 3), -100))
    assert float(boxwood.filter_jit(loss)(logits, labels)) == 0.0
    if name != "causal_lm":  # (eagerly: test_models_loss.py)
        assert float(loss(logits, labels)) == 0.0


def test_ignored_labels_pass_the_check_and_count_nothing():
    logits, labels = _inputs(3, [[1, -100, 2]])
    logits = jax.random.normal(jax.random.key(1), logits.shape)
    expected = _sequence_loss(logits[:, [0, 2]], labels[:, [0, 2]])
    np.testing.assert_allclose(_sequence_loss(logits, labels), expected, rtol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="words of the CPU runtime")
def test_a_bad_label_under_plain_jit_reads_in_seven_lines():
    """XLA reports a failed check under `jax.jit` as its own error: the message
    is on its third line, after one frame (not the whole call stack), and the
    check's site (the user's frame) follows."""
    logits, labels = _inputs(3, [[1, 3]])
    with pytest.raises(Exception, match="CpuCallback|callback") as info:
        jax.jit(_sequence_loss)(logits, labels).block_until_ready()
    lines = str(info.value).splitlines()
    assert len(lines) == 7, str(info.value)
    assert lines[4].startswith("The check that failed")
    assert "test_models_labels.py" in lines[5]
    assert lines[2].startswith(
        "BoxwoodRuntimeError: BertForSequenceClassification.loss: `labels` must "
        "hold class ids from 0 to 2 (`num_labels` = 3), or -100"
    )
