"""Options of a `config.json` that do not change what a model computes (`use_cache`,
bookkeeping, ...) are kept in `config.extra`, the dropout rates and
`initializer_range` in fields of their own, and all are written back by
`save_pretrained`, so a boxwood round trip gives `transformers` the same config."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import (
    copy_checkpoint,
    save_tiny,
    shared_model,
    shared_tiny,
    transformers,
)

OPTIONS = {
    "gpt2": dict(
        attn_pdrop=0.11, embd_pdrop=0.12, resid_pdrop=0.13, initializer_range=0.3,
        summary_first_dropout=0.2,
    ),
    "llama": dict(attention_dropout=0.15, initializer_range=0.3),
    "mistral": dict(attention_dropout=0.15, initializer_range=0.3),
    "qwen2": dict(attention_dropout=0.15, initializer_range=0.3),
    "gemma": dict(attention_dropout=0.15, initializer_range=0.3),
    "bert": dict(
        hidden_dropout_prob=0.11, attention_probs_dropout_prob=0.12,
        initializer_range=0.3, classifier_dropout=0.2,
    ),
    "vit": dict(
        hidden_dropout_prob=0.11, attention_probs_dropout_prob=0.12,
        initializer_range=0.3, encoder_stride=8,
    ),
}  # fmt: skip


def _option(config, name):
    """An option of `config`: its field, or else its entry of `extra`."""
    if name in {f.name for f in dataclasses.fields(config)}:
        return getattr(config, name)
    return config.extra[name]


@pytest.mark.parametrize("kind", sorted(OPTIONS))
def test_a_round_trip_keeps_every_option(kind, tmp_path):
    options = OPTIONS[kind]
    save_tiny(kind, tmp_path / "theirs", **options)
    original = json.loads((tmp_path / "theirs" / "config.json").read_text())
    model = bm.from_pretrained(tmp_path / "theirs")
    for name, value in options.items():
        assert _option(model.config, name) == value, name
    bm.save_pretrained(model, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    # every option of the original file, with its value (the writer's version
    # number is the one thing `save_pretrained` does not copy)
    del original["transformers_version"]
    assert {k: written.get(k, "MISSING") for k in original} == original
    reference = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    for name, value in options.items():
        assert getattr(reference, name) == value, name
    again = bm.from_pretrained(tmp_path / "ours")
    assert again.config == model.config


def _option(config, name):
    """An option of `config`: a field where the model uses it (BERT's and ViT's
    dropout and initialisation), else kept in `extra`."""
    return config.extra[name] if name in config.extra else getattr(config, name)


def test_kept_options_change_nothing_computed(tmp_path):
    plain, _ = shared_model("gpt2")
    copy_checkpoint(shared_tiny("gpt2")[0], tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(attn_pdrop=0.9, embd_pdrop=0.9, initializer_range=5.0)
    (tmp_path / "config.json").write_text(json.dumps(config))
    other = bm.from_pretrained(tmp_path)
    assert other.config.attn_pdrop == 0.9 and other.config.initializer_range == 5.0
    assert other.config != plain.config  # ... so jit keeps the two apart
    ids = jnp.arange(3, 12)
    forward = boxwood.filter_jit(lambda model: model(ids))  # one compile per config
    np.testing.assert_array_equal(
        np.asarray(forward(other)), np.asarray(forward(plain))
    )


def test_extra_is_an_immutable_hashable_mapping():
    config = bm.GPT2Config.from_dict(
        {"use_cache": False, "task_specific_params": {"text": {"max": 50}}}
    )
    extra = config.extra
    assert isinstance(extra, bm.IgnoredOptions)
    assert dict(extra) == {
        "use_cache": False,
        "task_specific_params": {"text": {"max": 50}},
    }
    extra["task_specific_params"]["text"]["max"] = 1  # a copy: nothing changes
    assert config.extra["task_specific_params"] == {"text": {"max": 50}}
    assert hash(config) == hash(bm.GPT2Config.from_dict(config.to_dict()))
    model = boxwood.filter_eval_shape(bm.GPT2LMHeadModel, config, key=jax.random.key(0))
    assert model.config is config  # a static field: hashable
    # a plain mapping given to the constructor is kept as `IgnoredOptions`
    direct = bm.LlamaConfig(extra={"pretraining_tp": 1})
    assert isinstance(direct.extra, bm.IgnoredOptions)
    assert direct.extra == {"pretraining_tp": 1}
    assert direct.to_dict()["pretraining_tp"] == 1
    assert bm.GPT2Config().extra == {} and "extra" not in bm.GPT2Config().to_dict()


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"n_embd": 8}, r"`extra` holds the option `n_embd`, a field of GPT2Config: "
         r"pass it as `GPT2Config\(n_embd=...\)`"),
        ({"torch_dtype": "float32"}, "`torch_dtype`, which `save_pretrained` writes"),
        ({"rotary_dim": 4}, "`rotary_dim`, which boxwood.models.GPT2LMHeadModel "
         "does not know"),
        ({"add_cross_attention": True}, r"`extra`: the option `add_cross_attention` "
         r"= True is not supported .* only `false`"),
        ({"n_ctx": {1, 2}}, "`n_ctx` = .* is not a JSON value"),
    ],
)  # fmt: skip
def test_extra_takes_only_options_that_change_nothing(extra, match):
    with pytest.raises(bm.ConfigError, match=match):
        bm.GPT2Config(extra=extra)
