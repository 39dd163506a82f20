"""BERT and ViT as models to train: initialisation as `transformers` draws it
(from `initializer_range`), dropout from the configs' rates (switched by
`boxwood.nn.inference_mode`, one compile per mode, the fused attention kept when
off), BERT's `attention_mask` checked to hold 0 and 1, the padding row."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import boxwood
import boxwood.models as bm
from _hf_models import shared_model, torch, transformers

BERT = dict(
    vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, max_position_embeddings=32, type_vocab_size=16,
    pad_token_id=0,
)  # fmt: skip
SMALL = dict(
    vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=32, pad_token_id=0,
)  # fmt: skip
VIT = dict(
    hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
    intermediate_size=128, image_size=16, patch_size=4,
)  # fmt: skip


def _files(ours, theirs, tmp_path):
    """The tensors of both models as `save_pretrained` writes them."""
    bm.save_pretrained(ours, tmp_path / "ours")
    theirs.save_pretrained(str(tmp_path / "theirs"))
    return (
        load_file(tmp_path / "ours" / "model.safetensors"),
        load_file(tmp_path / "theirs" / "model.safetensors"),
    )


def _assert_drawn_alike(ours, theirs):
    assert set(ours) == set(theirs)
    for name, reference in theirs.items():
        mine = ours[name]
        if reference.std() == 0:  # biases, LayerNorms, the masked-LM bias
            np.testing.assert_array_equal(mine, reference, err_msg=name)
        else:
            assert abs(mine.std() / reference.std() - 1) < 0.1, name
            assert abs(mine.mean()) < 0.1 * reference.std(), name


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_bert_is_initialised_as_transformers_does(head, tmp_path):
    options = dict(BERT, initializer_range=0.5, num_labels=16)
    config = bm.BertConfig.from_dict(options)
    ours = getattr(bm, head)(config, key=jax.random.key(0))
    torch.manual_seed(0)
    theirs = getattr(transformers, head)(transformers.BertConfig(**options))
    mine, reference = _files(ours, theirs, tmp_path)
    _assert_drawn_alike(mine, reference)
    table = mine["bert.embeddings.word_embeddings.weight"]
    assert not table[0].any() and table[1].all()  # the padding row starts at zero


def test_vit_is_initialised_as_transformers_does(tmp_path):
    # at this range the class token and position embeddings' cut at +-2 shows
    options = dict(VIT, initializer_range=2.0, num_labels=16)
    config = bm.ViTConfig.from_dict(options)
    ours = bm.ViTForImageClassification(config, key=jax.random.key(0))
    torch.manual_seed(0)
    theirs = transformers.ViTForImageClassification(transformers.ViTConfig(**options))
    mine, reference = _files(ours, theirs, tmp_path)
    _assert_drawn_alike(mine, reference)
    assert np.abs(mine["vit.embeddings.position_embeddings"]).max() <= 2


def test_vits_first_loss_is_near_log_of_the_class_count():
    # (drawn as before, N(0, 1) class token and position embeddings and
    # PyTorch's default linears, it was 2.86)
    config = bm.ViTConfig(**dict(VIT, hidden_size=64), labels=tuple("abcdefghij"))
    model = boxwood.nn.inference_mode(
        bm.ViTForImageClassification(config, key=jax.random.key(1))
    )
    random = np.random.RandomState(0)
    images = random.randn(16, 3, 16, 16).astype(np.float32)
    labels = random.randint(0, 10, 16)
    loss = boxwood.filter_jit(lambda m: m.loss(jax.vmap(m)(images), labels))(model)
    assert abs(float(loss) - math.log(10)) < 0.1


def _dropouts(model):
    """`{path: p}` of every dropout layer of `model`."""
    found = jax.tree_util.tree_leaves_with_path(
        model, is_leaf=lambda x: isinstance(x, boxwood.nn.Dropout)
    )
    return {
        jax.tree_util.keystr(path): leaf.p
        for path, leaf in found
        if isinstance(leaf, boxwood.nn.Dropout)
    }


RATES = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2)


def test_dropout_rates_reach_their_layers():
    config = bm.BertConfig(**BERT, **RATES, classifier_dropout=0.3)
    model = bm.BertForSequenceClassification(config, key=jax.random.key(0))
    assert _dropouts(model) == {
        ".bert.embeddings.dropout": 0.1,
        ".bert.encoder.layer.layers.attention.attn.dropout": 0.2,
        ".bert.encoder.layer.layers.attention.dropout": 0.1,
        ".bert.encoder.layer.layers.dropout": 0.1,
        ".dropout": 0.3,
    }
    vit = bm.ViTForImageClassification(
        bm.ViTConfig(**VIT, **RATES), key=jax.random.key(0)
    )
    assert _dropouts(vit) == {
        ".vit.embeddings.dropout": 0.1,
        ".vit.encoder.layer.layers.attention.dropout": 0.2,
        ".vit.encoder.layer.layers.dropout": 0.1,
    }


@pytest.fixture(scope="module")
def classifier():
    """A BERT sequence classifier with only its classifier's dropout (0.4)."""
    config = bm.BertConfig(
        **SMALL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout=0.4, labels=tuple("abc"),
    )  # fmt: skip
    return bm.BertForSequenceClassification(config, key=jax.random.key(0))


def test_dropout_statistics_follow_the_rates(classifier):
    ids = jnp.arange(3, 19)

    @boxwood.filter_jit
    def logits_and_pooled(model):
        keys = jax.random.split(jax.random.key(5), 4000)
        quiet = boxwood.nn.inference_mode(model)
        pooled = quiet.bert.pooled(quiet.bert(ids))
        return jax.vmap(lambda k: model(ids, key=k))(keys), quiet(ids), pooled

    # the classifier is linear: over keys, its logits average to the inference
    # logits, with variance sum_j (w_ij x_j)^2 p / (1 - p)
    logits, expected, pooled = logits_and_pooled(classifier)
    spread = np.sum((classifier.classifier.weight * pooled[None, :]) ** 2, axis=1)
    np.testing.assert_allclose(logits.mean(0), expected, atol=0.05)
    np.testing.assert_allclose(logits.var(0) / spread, 0.4 / 0.6, rtol=0.1)

    # the embeddings' dropout zeroes a `hidden_dropout_prob` share of entries
    @boxwood.filter_jit
    def zeroed(embeddings):
        keys = jax.random.split(jax.random.key(6), 50)
        out = jax.vmap(lambda k: embeddings(ids, jnp.zeros_like(ids), k))(keys)
        return jnp.mean(out == 0)

    config = bm.BertConfig(**SMALL, hidden_dropout_prob=0.3)
    embeddings = bm.BertModel(config, key=jax.random.key(0)).embeddings
    assert abs(float(zeroed(embeddings)) - 0.3) < 0.01


def test_training_and_evaluation_each_compile_once(classifier):
    traces = []

    @boxwood.filter_jit
    def step(model, ids, labels, key):
        traces.append("train")

        def loss(model):
            keys = jax.random.split(key, ids.shape[0])
            return model.loss(jax.vmap(lambda i, k: model(i, key=k))(ids, keys), labels)

        return boxwood.filter_value_and_grad(loss)(model)

    @boxwood.filter_jit
    def evaluate(model, ids):
        traces.append("eval")
        return jax.vmap(model)(ids)

    ids = jnp.arange(3, 35).reshape(2, 16)
    labels = jnp.asarray([0, 2])
    losses = [step(classifier, ids + i, labels, jax.random.key(i))[0] for i in range(3)]
    assert len(set(map(float, losses))) == 3  # each key drops other entries
    quiet = boxwood.nn.inference_mode(classifier)
    first, second = evaluate(quiet, ids), evaluate(quiet, ids + 1)
    assert traces == ["train", "eval"]
    assert first.shape == (2, 3) and not np.array_equal(first, second)


@pytest.fixture
def fused_calls(monkeypatch):
    """How many `jax.nn.dot_product_attention` calls a trace makes."""
    calls = []
    real = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("attention_rate", [0.0, 0.3])
def test_fused_attention_unless_attention_dropout_is_active(
    attention_rate, fused_calls
):
    config = bm.BertConfig(
        **SMALL, hidden_dropout_prob=0.1, attention_probs_dropout_prob=attention_rate
    )
    model = bm.BertModel(config, key=jax.random.key(0))
    ids = jnp.arange(3, 11)
    jax.eval_shape(lambda k: model(ids, key=k), jax.random.key(1))
    assert len(fused_calls) == (1 if attention_rate == 0 else 0)
    jax.eval_shape(boxwood.nn.inference_mode(model), ids)
    assert len(fused_calls) == (2 if attention_rate == 0 else 1)


def test_loaded_models_are_in_inference_mode():
    for kind in ("bert", "vit"):
        model, _ = shared_model(kind)
        assert model.config.hidden_dropout_prob > 0 or kind == "vit"
        assert not any(
            not d.inference
            for d in jax.tree_util.tree_leaves(
                model, is_leaf=lambda x: isinstance(x, boxwood.nn.Dropout)
            )
            if isinstance(d, boxwood.nn.Dropout)
        )


def test_a_training_model_needs_a_key():
    model = bm.BertModel(bm.BertConfig(**SMALL), key=jax.random.key(0))
    with pytest.raises(
        RuntimeError,
        match=r"BertModel is in training mode .*`model\(input_ids, key=key\)`.*"
        r"boxwood.nn.inference_mode",
    ):
        model(jnp.arange(3, 8))
    head = bm.BertForTokenClassification(bm.BertConfig(**SMALL), key=jax.random.key(0))
    with pytest.raises(RuntimeError, match="BertForTokenClassification is in training"):
        head(jnp.arange(3, 8))
    vit = bm.ViTForImageClassification(
        bm.ViTConfig(**VIT, **RATES), key=jax.random.key(0)
    )
    with pytest.raises(
        RuntimeError, match=r"ViTForImageClassification is in training mode .*pixel"
    ):
        vit(jnp.zeros((3, 16, 16)))
    # without a dropout rate (ViT's default) no key is needed
    plain = bm.ViTForImageClassification(bm.ViTConfig(**VIT), key=jax.random.key(0))
    jax.eval_shape(plain, jnp.zeros((3, 16, 16)))


@pytest.fixture(scope="module")
def quiet_bert():
    config = bm.BertConfig(**SMALL)
    return boxwood.nn.inference_mode(bm.BertModel(config, key=jax.random.key(0)))


IDS = jnp.asarray([5, 6, 7, 8])


@pytest.mark.parametrize("bad", [2, 7, -1])
def test_attention_mask_of_other_values_raises_eagerly(quiet_bert, bad):
    with pytest.raises(
        ValueError,
        match=r"BertModel: `attention_mask` must hold only 1 \(a token to attend "
        rf"to\) and 0 \(padding\); got {bad} at position 1",
    ):
        quiet_bert(IDS, jnp.asarray([1, bad, 1, 0]))


def test_attention_mask_of_other_values_raises_under_jit(quiet_bert):
    call = boxwood.filter_jit(lambda m, mask: m(IDS, mask))
    with pytest.raises(boxwood.BoxwoodRuntimeError, match="`attention_mask` must"):
        call(quiet_bert, jnp.asarray([1, 1, 2, 0])).block_until_ready()
    ones = call(quiet_bert, jnp.asarray([1, 1, 1, 0]))
    booleans = call(quiet_bert, jnp.asarray([True, True, True, False]))
    np.testing.assert_allclose(ones, booleans, atol=1e-6)


def test_float_attention_masks_are_taken_as_the_causal_lms_take_them(quiet_bert):
    ints = quiet_bert(IDS, jnp.asarray([1, 1, 1, 0]))
    floats = jnp.asarray([1.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(quiet_bert(IDS, floats), ints)
    call = boxwood.filter_jit(lambda m, mask: m(IDS, mask))
    np.testing.assert_allclose(call(quiet_bert, floats), ints, atol=1e-6)
    with pytest.raises(
        ValueError,
        match=r"BertModel: `attention_mask` must hold only 1 \(a real token\) and 0 "
        r"\(padding\); got 0.5 at position 2",
    ):
        quiet_bert(IDS, jnp.asarray([1.0, 1.0, 0.5, 0.0]))


def test_padding_lookups_pass_no_gradient_to_their_row(quiet_bert):
    ids = jnp.asarray([5, 0, 0, 9])  # 0 is `pad_token_id`
    grads = boxwood.filter_jit(boxwood.filter_grad(lambda m: jnp.sum(m(ids) ** 2)))(
        quiet_bert
    )
    table = grads.embeddings.word_embeddings.weight
    assert not table[0].any() and table[5].any() and table[9].any()
