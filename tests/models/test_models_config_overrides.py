"""`from_pretrained(path, **config_overrides)`: options of the file's config set
by keyword, as `transformers` takes them (`num_labels=5` to fine-tune a
classifier), for every family; a head the file holds for other labels is an
error unless `ignore_mismatched_sizes=True` draws it anew."""

import jax
import numpy as np
import pytest

import boxwood
import boxwood.models as bm

BERT = bm.BertConfig(
    vocab_size=32,
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=8,
    labels=("neg", "pos"),
)
SEQ = bm.BertForSequenceClassification


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A body-only BERT file and one with a two-label sequence head."""
    root = tmp_path_factory.mktemp("overrides")
    body = bm.BertModel(BERT, key=jax.random.key(1))
    body.save_pretrained(root / "body")
    head = SEQ(BERT, key=jax.random.key(2))
    head.save_pretrained(root / "head")
    return {"body": (root / "body", body), "head": (root / "head", head)}


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_num_labels_sizes_a_head_drawn_on_a_body_file(files):
    directory, body = files["body"]
    with pytest.warns(UserWarning, match=r"has no `classifier\.bias`"):
        model = SEQ.from_pretrained(directory, num_labels=5, hidden_dropout_prob=0.0)
    assert model.classifier.weight.shape == (5, 8)
    assert model.config.labels == tuple(f"LABEL_{i}" for i in range(5))
    assert model.config.hidden_dropout_prob == 0.0
    _same(model.bert.encoder, body.encoder)
    # the automatic loader takes them too (a body file: a `BertModel`), and
    # `id2label` names the labels
    named = bm.from_pretrained(directory, id2label={0: "a", 1: "b", 2: "c"})
    assert type(named) is bm.BertModel and named.config.labels == ("a", "b", "c")


def test_an_unknown_override_is_a_type_error_naming_the_config(files):
    directory, _ = files["head"]
    for load in (SEQ.from_pretrained, bm.from_pretrained):
        with pytest.raises(
            TypeError,
            match=r"unexpected keyword argument `num_label`: .* option of the config, "
            r"boxwood\.models\.BertConfig\. .*fields of BertConfig \(.*num_labels",
        ):
            load(directory, num_label=5)
    with pytest.raises(TypeError, match="`model_type`"):  # describes the file
        bm.from_pretrained(directory, model_type="gpt2")
    with pytest.raises(
        bm.ConfigError,
        match=r"config\.json with from_pretrained\(hidden_dropout_prob=\): the "
        r"option `hidden_dropout_prob` = 2",
    ):
        bm.from_pretrained(directory, hidden_dropout_prob=2)


def test_a_head_of_other_labels_is_an_error_unless_drawn_anew(files):
    directory, head = files["head"]
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`classifier\.bias` is \(2,\) in the file, \(5,\) in the model; "
        r"`classifier\.weight` is \(2, 8\) in the file, \(5, 8\) in the model\. "
        r".*ignore_mismatched_sizes=True",
    ):
        SEQ.from_pretrained(directory, num_labels=5)
    with pytest.warns(
        UserWarning, match=r"holds other shapes of `classifier\.bias`.*newly"
    ) as record:
        model = SEQ.from_pretrained(
            directory, num_labels=5, ignore_mismatched_sizes=True
        )
    assert len(record) == 1
    fresh = SEQ(model.config, key=jax.random.key(0))  # drawn as a build draws it
    # (the load's draw is compiled: equal to the last bits or so)
    np.testing.assert_allclose(model.classifier.weight, fresh.classifier.weight, 1e-6)
    assert not np.asarray(model.classifier.bias).any()
    _same(model.bert, head.bert)
    # the same number of labels keeps the file's head and names
    same = SEQ.from_pretrained(directory, num_labels=2)
    _same(same.classifier, head.classifier)
    assert same.config.labels == ("neg", "pos")


def test_other_families_take_overrides(tmp_path):
    config = bm.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    bm.GPT2LMHeadModel(config, key=jax.random.key(0)).save_pretrained(tmp_path / "g")
    model = bm.from_pretrained(tmp_path / "g", attn_pdrop=0.0, resid_pdrop=0.25)
    assert (model.config.attn_pdrop, model.config.resid_pdrop) == (0.0, 0.25)
    with pytest.raises(TypeError, match=r"`type_vocab_size`: .*GPT2Config"):
        bm.GPT2LMHeadModel.from_pretrained(tmp_path / "g", type_vocab_size=3)
    # a language model's file read as a classifier: the new `score` is drawn
    with pytest.warns(UserWarning, match=r"has no `score\.weight`"):
        scorer = bm.GPT2ForSequenceClassification.from_pretrained(
            tmp_path / "g", num_labels=3
        )
    assert scorer.score.weight.shape == (3, 8) and scorer.score.bias is None
    vit = bm.ViTConfig(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=8, image_size=8, patch_size=4, labels=("a", "b", "c"),
    )  # fmt: skip
    bm.ViTForImageClassification(vit, key=jax.random.key(0)).save_pretrained(
        tmp_path / "v"
    )
    with pytest.warns(UserWarning, match=r"`classifier\.weight` is \(3, 8\)"):
        model = bm.from_pretrained(
            tmp_path / "v", num_labels=4, ignore_mismatched_sizes=True
        )
    assert model.classifier.weight.shape == (4, 8)


def test_config_from_file_reads_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "gpt2", "vocab_size": 40, "n_embd": 16, "n_layer": 1,'
        ' "n_head": 2, "n_positions": 32}'
    )
    config = bm.GPT2Config.from_file(path)
    assert (config.vocab_size, config.n_embd, config.n_layer) == (40, 16, 1)
    assert config == bm.GPT2Config.from_dict(
        {"vocab_size": 40, "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32}
    )
    path.write_text('{"vocab_size": 40, "n_embd": "wide"}')
    with pytest.raises(bm.ConfigError, match="`n_embd` = .wide. must be of type int"):
        bm.GPT2Config.from_file(path)


def test_num_labels_disagreeing_with_id2label_is_an_error_naming_both(files):
    directory, _ = files["head"]
    both = r"`num_labels` = 3 disagrees with `id2label`, which names 2 labels"
    with pytest.raises(
        bm.ConfigError, match=r"from_pretrained\(num_labels=, id2label=\): " + both
    ):
        SEQ.from_pretrained(directory, num_labels=3, id2label={0: "a", 1: "b"})
    with pytest.raises(bm.ConfigError, match=both):
        bm.BertConfig.from_dict({"num_labels": 3, "id2label": {"0": "a", "1": "b"}})
    with pytest.raises(
        bm.ConfigError, match=r"BertConfig\(num_labels=, id2label=\): `num_labels`"
    ):
        bm.BertConfig(num_labels=3, id2label={0: "a", 1: "b"})
    with pytest.raises(
        bm.ConfigError, match="`num_labels` = 3 disagrees with `labels`"
    ):
        bm.BertConfig(num_labels=3, labels=("a", "b"))
    # agreeing, they are one choice
    agreed = SEQ.from_pretrained(directory, num_labels=2, id2label={0: "x", 1: "y"})
    assert agreed.config.labels == ("x", "y")


def test_a_config_takes_the_keywords_from_dict_and_from_pretrained_take():
    built = bm.BertConfig(vocab_size=32, num_labels=3, use_cache=False)
    read = bm.BertConfig.from_dict(
        {"vocab_size": 32, "num_labels": 3, "use_cache": False}
    )
    assert built == read and built.labels == ("LABEL_0", "LABEL_1", "LABEL_2")
    assert dict(built.extra) == {"use_cache": False}
    named = bm.BertConfig(32, id2label={1: "pos", 0: "neg"}, extra={"prefix": "p"})
    assert named.labels == ("neg", "pos") and named.vocab_size == 32
    assert dict(named.extra) == {"prefix": "p"}
    assert bm.ViTConfig(num_labels=4).num_labels == 4
    with pytest.raises(
        TypeError, match=r"BertConfig\(\) got an unexpected keyword .*`hiden_size`"
    ):
        bm.BertConfig(hiden_size=8)
