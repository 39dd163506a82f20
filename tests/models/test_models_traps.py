"""What a user coming from `transformers` would otherwise meet silently: a key
given to a model whose dropout is off, right-padded prompts given to `generate`
without a mask; and the PyTorch methods a model does not have."""

import warnings

import jax
import numpy as np
import pytest

import boxwood.models as bm
import boxwood.models._training as training
from _tiny_causal_lms import gpt2, llama

IDS = np.random.RandomState(0).randint(3, 97, size=(2, 6))
BERT = bm.BertConfig(32, 8, 1, 2, 16, max_position_embeddings=8)
KEY = jax.random.key(0)


def test_a_key_to_a_model_without_dropout_rates_says_nothing(monkeypatch):
    monkeypatch.setattr(training, "_KEY_IN_INFERENCE_WARNED", set())
    model = llama()  # training mode, `attention_dropout` 0: the key changes nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.eval_shape(lambda: model(IDS[0], key=jax.random.key(0)))


def _checked_only(**kwargs):
    """`generate`'s argument checks alone: `max_new_tokens=0` is refused after
    the prompts are read (and warned about), before anything compiles."""
    with pytest.raises(ValueError, match="`max_new_tokens` must be at least 1"):
        bm.generate(gpt2(), max_new_tokens=0, pad_token_id=0, **kwargs)


def test_generate_warns_on_right_padding_without_a_mask():
    right = IDS.copy()
    right[1, 4:] = 0
    match = (
        r"`generate`: row 1 of `input_ids` ends with `pad_token_id` = 0: right "
        r"padding was detected.*Pass the tokenizer's `attention_mask=`"
    )
    with pytest.warns(UserWarning, match=match):
        _checked_only(input_ids=right)
    with pytest.warns(UserWarning, match=r"rows 0, 1 of `input_ids` end with"):
        _checked_only(input_ids=[[5, 0], [6, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _checked_only(input_ids=right, attention_mask=(right != 0).astype(np.int32))
        _checked_only(input_ids=IDS)  # no row ends with a pad
        _checked_only(input_ids=right[1])  # one prompt: its own length


@pytest.mark.parametrize(
    "name, way",
    [
        ("eval", r"`model = boxwood\.nn\.inference_mode\(model\)` returns a copy"),
        ("train", r"`model = boxwood\.nn\.inference_mode\(model, False\)`"),
        ("parameters", r"`jax\.tree\.leaves\(boxwood\.filter\(model, boxwood\.is_"),
        ("named_parameters", r"`boxwood\.state_dict\(model\)`"),
        ("to", r"`jax\.device_put\(model, device\)`.*`boxwood\.cast_floating"),
        ("generate", r"`boxwood\.models\.generate\(model, input_ids"),
    ],
)
def test_pytorch_methods_point_to_boxwoods_way(name, way):
    for model in (gpt2(), bm.BertForSequenceClassification(BERT, key=KEY)):
        cls = type(model).__name__
        match = rf"'{cls}' object has no attribute '{name}' \(it is a PyTorch .*{way}"
        with pytest.raises(AttributeError, match=match):
            getattr(model, name)()


def test_other_missing_attributes_are_plain_attribute_errors():
    model = gpt2()
    with pytest.raises(
        AttributeError, match=r"^'GPT2LMHeadModel' object has no attribute 'x'$"
    ):
        _ = model.x
    assert getattr(model, "x", None) is None
