"""Loading a BERT head from a file that lacks it (the fine-tuning workflow): the
head's own parameters are drawn as a fresh build draws them, with a warning
listing them and the other heads' tensors dropped; a missing body tensor is
still an error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm

safetensors_numpy = pytest.importorskip("safetensors.numpy")

# wide draws and eight labels: 512 classifier weights for the statistics
CONFIG = bm.BertConfig(
    vocab_size=97,
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    labels=tuple("abcdefgh"),
    initializer_range=0.5,
)
HEADS = (bm.BertForSequenceClassification, bm.BertForTokenClassification)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`{"body": (directory, model), "masked_lm": ...}`: a `BertModel` and a
    `BertForMaskedLM` written by `save_pretrained`."""
    root = tmp_path_factory.mktemp("saved")
    out = {}
    for name, cls in (("body", bm.BertModel), ("masked_lm", bm.BertForMaskedLM)):
        model = cls(CONFIG, key=jax.random.key(1))
        model.save_pretrained(root / name)
        out[name] = root / name, model
    return out


def _same(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("cls", HEADS)
@pytest.mark.parametrize("source", ["body", "masked_lm"])
def test_a_head_loads_from_a_file_without_it(saved, cls, source):
    directory, original = saved[source]
    body = original if source == "body" else original.bert
    new = r"`classifier\.bias`, `classifier\.weight`"
    if cls is bm.BertForSequenceClassification and source == "masked_lm":
        new = r"`bert\.pooler\.dense\.bias`, `bert\.pooler\.dense\.weight`, " + new
    unused = {
        (bm.BertForSequenceClassification, "body"): None,
        (bm.BertForTokenClassification, "body"): r"`bert\.pooler\.dense\.bias`",
    }.get((cls, source), r"`cls\.predictions\.bias`, `cls\.predictions\.transform")
    match = rf"{cls.__name__}\.from_pretrained: the checkpoint in .* has no {new};"
    match += r" these parameters .* newly initialised .*jax\.random\.key\(0\).*"
    match += r"Train the model"
    if unused:
        match += rf".* The checkpoint's {unused}.* not used by {cls.__name__}"
    with pytest.warns(UserWarning, match=match) as record:
        model = cls.from_pretrained(directory)
    assert len(record) == 1
    if unused is None:
        assert "not used" not in str(record[0].message)
    # the body is the file's
    _same(model.bert.embeddings, body.embeddings)
    _same(model.bert.encoder, body.encoder)
    if cls is bm.BertForSequenceClassification and source == "body":
        _same(model.bert.pooler, body.pooler)
    # the head is drawn as a fresh build with `jax.random.key(0)` draws it
    fresh = cls(CONFIG, key=jax.random.key(0))
    _same(model.classifier, fresh.classifier)
    weight = np.asarray(model.classifier.weight)
    assert abs(weight.std() - 0.5) < 0.05 and abs(weight.mean()) < 0.06
    assert not np.asarray(model.classifier.bias).any()
    assert model.dropout.inference  # loaded in inference mode, as any load
    assert jax.eval_shape(model, jnp.arange(1, 9)).shape[-1] == 8


def test_the_key_draws_the_head(saved):
    directory, _ = saved["body"]
    key = jax.random.key(7)
    with pytest.warns(UserWarning, match="newly initialised"):
        model = bm.BertForSequenceClassification.from_pretrained(directory, key=key)
    fresh = bm.BertForSequenceClassification(CONFIG, key=key)
    _same(model.classifier, fresh.classifier)


def test_a_file_with_the_head_loads_without_a_warning(saved, tmp_path):
    head = bm.BertForSequenceClassification(CONFIG, key=jax.random.key(3))
    head.save_pretrained(tmp_path)
    _same(
        bm.BertForSequenceClassification.from_pretrained(tmp_path),
        boxwood.nn.inference_mode(head),
    )


def test_a_missing_body_tensor_is_still_an_error(saved, tmp_path):
    directory, _ = saved["body"]
    tensors = safetensors_numpy.load_file(str(directory / "model.safetensors"))
    del tensors["encoder.layer.0.output.dense.bias"]
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    safetensors_numpy.save_file(
        tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"}
    )
    with pytest.raises(
        boxwood.CheckpointError, match=r"bert\.encoder\.layer\.0\.output\.bias: missing"
    ):
        bm.BertForSequenceClassification.from_pretrained(tmp_path)


def test_dropped_tensors_are_listed_even_when_nothing_is_drawn(tmp_path):
    """A sequence classifier's file read by a token classifier: the classifier
    fits (same labels), and the pooler, which it does not use, is named."""
    head = bm.BertForSequenceClassification(CONFIG, key=jax.random.key(3))
    head.save_pretrained(tmp_path)
    match = (
        r"BertForTokenClassification\.from_pretrained: the checkpoint in .* holds "
        r"`bert\.pooler\.dense\.bias`, `bert\.pooler\.dense\.weight`, which "
        r"BertForTokenClassification does not use .*: they were dropped"
    )
    with pytest.warns(UserWarning, match=match) as record:
        model = bm.BertForTokenClassification.from_pretrained(tmp_path)
    assert len(record) == 1
    _same(model.classifier, head.classifier)
