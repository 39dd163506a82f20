"""A causal LM built from a config is initialised as `transformers` initialises
the same config: every parameter's distribution (normal draws of
`initializer_range`, GPT-2's scaled `c_proj`, zero biases, norms' ones and
Gemma's zero offsets, the zeroed padding row) compared leaf by leaf with the
PyTorch model, and a first loss on random ids close to `ln(vocab_size)`."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import torch, transformers
from boxwood.models._stacking import layer_arrays

VOCAB = 512
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
)
HF = {
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=4, n_head=4,
        bos_token_id=1, eos_token_id=2, initializer_range=0.03,
    ),
    "llama": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=False),
    "mistral": lambda: transformers.MistralConfig(**COMMON, num_key_value_heads=2),
    "qwen2": lambda: transformers.Qwen2Config(
        **COMMON, num_key_value_heads=2, initializer_range=0.05
    ),
    "gemma": lambda: transformers.GemmaConfig(
        **COMMON, num_key_value_heads=2, head_dim=16
    ),
}  # fmt: skip
KINDS = sorted(HF)


@functools.cache
def _pair(kind):
    """`(boxwood arrays, transformers arrays, boxwood model)` by checkpoint name,
    both models built from the same config."""
    torch.manual_seed(0)
    config = HF[kind]()
    reference = getattr(transformers, _HF_CLASS[kind])(config)
    theirs = {n: p.detach().numpy() for n, p in reference.named_parameters()}
    cls = getattr(bm, _HF_CLASS[kind])
    # read as `config.json` holds it (`save_pretrained` writes the diff)
    ours_config = cls.config_class.from_dict(json.loads(config.to_json_string()))
    model = cls(ours_config, key=jax.random.key(0))
    ours = {cls.checkpoint_name(n): a for n, a in layer_arrays(model)}
    return ours, theirs, model


_HF_CLASS = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_parameter_is_drawn_as_transformers_draws_it(kind):
    ours, theirs, _ = _pair(kind)
    assert set(ours) == set(theirs)
    for name, expected in theirs.items():
        got = np.asarray(ours[name], np.float64)
        assert got.shape == expected.shape, name
        if expected.std() == 0:  # biases, norms: constants
            np.testing.assert_array_equal(got, expected, err_msg=name)
            continue
        std = expected.std()
        assert abs(got.std() / std - 1) < 0.1, (name, got.std(), std)
        # the mean of n draws lies within a few standard errors of 0
        assert abs(got.mean()) < 5 * std / math.sqrt(got.size), name


def test_gpt2_projections_are_scaled_by_depth():
    ours, theirs, model = _pair("gpt2")
    config = model.config
    scaled = config.initializer_range / math.sqrt(2 * config.n_layer)
    for name in ("attn.c_proj", "mlp.c_proj"):
        weight = ours[f"transformer.h.0.{name}.weight"]
        assert abs(weight.std() / scaled - 1) < 0.1, name
    assert abs(ours["transformer.h.0.attn.c_attn.weight"].std() / 0.03 - 1) < 0.1


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_the_padding_row_is_zero_as_in_transformers(kind):
    ours, theirs, model = _pair(kind)
    pad = model.config.pad_token_id
    table = ours["model.embed_tokens.weight"]
    assert not theirs["model.embed_tokens.weight"][pad].any()
    assert not table[pad].any() and table[pad + 1].any()


def test_qwen2_projection_biases_are_zero_and_gemma_norms_offsets_zero():
    ours, _, _ = _pair("qwen2")
    for proj in ("q", "k", "v"):
        assert not ours[f"model.layers.1.self_attn.{proj}_proj.bias"].any()
    ours, _, _ = _pair("gemma")
    assert not ours["model.norm.weight"].any()
    assert not ours["model.layers.0.input_layernorm.weight"].any()


@pytest.mark.parametrize("kind", KINDS)
def test_the_first_loss_is_about_log_vocab(kind):
    _, _, model = _pair(kind)
    ids = jax.random.randint(jax.random.key(1), (2, 32), 0, VOCAB)
    # one compiled program (op by op, each small operation compiles on its own)
    loss = boxwood.filter_jit(bm.causal_lm_loss)(boxwood.nn.inference_mode(model), ids)
    assert abs(float(loss) - math.log(VOCAB)) < 0.3, float(loss)


def test_initializer_range_is_an_option_that_round_trips(tmp_path):
    config = bm.LlamaConfig.from_dict({"initializer_range": 0.1, "vocab_size": 8})
    assert config.initializer_range == 0.1 and "initializer_range" not in config.extra
    assert bm.LlamaConfig.from_dict(config.to_dict()) == config
    assert bm.GPT2Config().initializer_range == 0.02
    wide = bm.LlamaForCausalLM(
        bm.LlamaConfig(**{**COMMON, "initializer_range": 0.2}), key=jax.random.key(0)
    )
    assert abs(float(jnp.std(wide.model.layers.layers.mlp.up_proj.weight)) - 0.2) < 0.02


@pytest.mark.parametrize(
    "options, match",
    [
        ({"initializer_range": -1.0}, "`initializer_range` = -1.0 is the standard"),
        ({"attn_pdrop": 1.5}, "`attn_pdrop` = 1.5 is a dropout probability"),
        ({"embd_pdrop": "x"}, "`embd_pdrop` = 'x' is a dropout probability"),
    ],
)
def test_bad_init_and_dropout_options_are_refused(options, match):
    with pytest.raises(bm.ConfigError, match=match):
        bm.GPT2Config.from_dict(options)
