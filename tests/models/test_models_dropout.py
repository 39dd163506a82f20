"""Dropout of the causal LMs: the configs' rates in `boxwood.nn.Dropout` layers
(training mode when built from a config, inference after `from_pretrained`,
switched by `boxwood.nn.inference_mode`), the key they need, the rates measured,
one compile per mode, and the fused attention kept where dropout is off."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
import boxwood.models._attend as layers
import boxwood.models._training as training
from _hf_models import shared_model
from boxwood.models._attend import Step, attend

# One layer: the dropout layers sit in each block alike (the stacked blocks
# share one `Dropout` per site; each layer draws from its own key).
GPT2 = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=4)
LLAMA = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    max_position_embeddings=32,
)
IDS = jnp.asarray(np.random.RandomState(0).randint(0, 64, size=16), jnp.int32)


@functools.cache
def _gpt2(**rates):
    return bm.GPT2LMHeadModel(bm.GPT2Config(**GPT2, **rates), key=jax.random.key(0))


@functools.cache
def _llama(rate):
    config = bm.LlamaConfig(**LLAMA, attention_dropout=rate)
    return bm.LlamaForCausalLM(config, key=jax.random.key(0))


def test_the_rates_sit_in_dropout_layers_in_training_mode():
    model = _gpt2(embd_pdrop=0.1, attn_pdrop=0.2, resid_pdrop=0.3)
    body = model.transformer
    block = body.h.layers
    found = {
        "drop": body.drop,
        "attn_dropout": block.attn.attn_dropout,
        "resid_dropout": block.attn.resid_dropout,
        "mlp.dropout": block.mlp.dropout,
    }
    assert {k: (d.p, d.inference) for k, d in found.items()} == {
        "drop": (0.1, False),
        "attn_dropout": (0.2, False),
        "resid_dropout": (0.3, False),
        "mlp.dropout": (0.3, False),
    }
    attention = _llama(0.25).model.layers.layers.self_attn.attention_dropout
    assert (attention.p, attention.inference) == (0.25, False)
    off = boxwood.nn.inference_mode(model)
    assert off.transformer.h.layers.mlp.dropout.inference
    # no arrays for the dropout layers: the checkpoint's names are unchanged
    assert len(jax.tree.leaves(off)) == len(jax.tree.leaves(model))


def test_from_pretrained_is_in_inference_mode():
    model, _ = shared_model("gpt2")
    assert model.config.attn_pdrop == 0.1
    assert model.transformer.drop.inference and model.transformer.h.layers.attn
    assert all(d.inference for d in jax.tree.leaves(
        model, is_leaf=lambda x: isinstance(x, boxwood.nn.Dropout)
    ) if isinstance(d, boxwood.nn.Dropout))  # fmt: skip
    assert model(IDS[:4]).shape == (4, 97)  # no key needed


def test_training_mode_without_a_key_is_an_error_naming_key_and_the_fix():
    model = _gpt2()  # transformers' default rates, 0.1
    fix = r"call it as `model\(input_ids, key=key\)`.*boxwood.nn.inference_mode"
    with pytest.raises(
        RuntimeError, match=r"GPT2LMHeadModel is in training mode .*" + fix
    ):
        model(IDS)
    with pytest.raises(RuntimeError, match="training mode"):
        jax.jit(lambda ids: model(ids))(IDS)
    with pytest.raises(
        RuntimeError, match=r"`causal_lm_loss\(model, input_ids, key=key\)`"
    ):
        bm.causal_lm_loss(model, IDS[None])
    # a zero rate needs no key: Llama's default `attention_dropout` is 0
    assert _llama(0.0)(IDS).shape == (16, 64)


def test_dropout_changes_the_outputs_and_inference_does_not(monkeypatch):
    monkeypatch.setattr(training, "_KEY_IN_INFERENCE_WARNED", set())
    model = _gpt2()
    a = model(IDS, key=jax.random.key(1))
    b = model(IDS, key=jax.random.key(2))
    again = model(IDS, key=jax.random.key(1))
    off = boxwood.nn.inference_mode(model)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(again))
    assert not np.allclose(a, b)
    plain = off(IDS)
    # a key in inference mode drops nothing, and says so (once per class)
    warning = r"GPT2LMHeadModel was given a dropout `key` but is in inference mode"
    with pytest.warns(UserWarning, match=warning + r".*inference_mode\(model, False\)"):
        keyed = off(IDS, key=jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(keyed), plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off(IDS, key=jax.random.key(2))  # warned once
    assert not np.allclose(a, plain)


def test_each_mode_compiles_once():
    traces = []

    @boxwood.filter_jit
    def loss(model, ids, key):
        traces.append(None)
        return bm.causal_lm_loss(model, ids, key=key)

    model = _gpt2()
    off = boxwood.nn.inference_mode(model)
    for seed in range(3):
        loss(model, IDS[None], jax.random.key(seed))
    assert len(traces) == 1
    with warnings.catch_warnings():  # (a key in inference mode: it warns once)
        warnings.simplefilter("ignore")
        for seed in range(3):
            loss(off, IDS[None], jax.random.key(seed))
    assert len(traces) == 2


def _kept_fraction(dropped, plain, p):
    """The fraction of entries kept, after checking each is 0 or scaled by
    1 / (1 - p)."""
    dropped, plain = np.asarray(dropped), np.asarray(plain)
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], plain[kept] / (1 - p), rtol=1e-5)
    return kept[plain != 0].mean()


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_the_residual_rate_is_measured_in_the_mlp(p):
    @boxwood.filter_jit  # one program, where eagerly each operation compiles
    def both(model):
        mlp = model.transformer.h[0].mlp
        x = jax.random.normal(jax.random.key(0), (64, 32))
        return mlp(x, jax.random.key(1)), boxwood.nn.inference_mode(mlp)(x)

    dropped, plain = both(_gpt2(resid_pdrop=p))
    fraction = _kept_fraction(dropped, plain, p)
    assert abs(fraction - (1 - p)) < 0.03  # 2,048 entries: 3 standard errors


def test_the_embedding_rate_is_measured():
    """With the blocks' output projections zeroed (no residual added) and the final
    norm taken out, the hidden states are the dropped embeddings."""
    p = 0.4
    model = _gpt2(embd_pdrop=p, attn_pdrop=0.0, resid_pdrop=0.0)
    h = model.transformer.h
    model = boxwood.tree_at(
        lambda m: (m.transformer.h.layers.attn.c_proj.weight,
                   m.transformer.h.layers.mlp.c_proj.weight, m.transformer.ln_f),
        model,
        (jnp.zeros_like(h.layers.attn.c_proj.weight),
         jnp.zeros_like(h.layers.mlp.c_proj.weight), boxwood.nn.Identity()),
    )  # fmt: skip
    ids = jnp.arange(32) % 64
    off = boxwood.nn.inference_mode(model)
    both = boxwood.filter_jit(lambda key: (model.hidden_states(ids, key=key),
                                           off.hidden_states(ids)))  # fmt: skip
    dropped, plain = both(jax.random.key(3))
    fraction = _kept_fraction(dropped, plain, p)
    assert abs(fraction - (1 - p)) < 0.04  # 1,024 entries


@pytest.mark.parametrize("p", [0.3])
def test_the_attention_rate_is_measured_on_the_probabilities(p):
    """With one-hot values, attention's output is its (dropped) probabilities."""
    seq = 64
    q = jax.random.normal(jax.random.key(0), (seq, 1, seq))
    k = jax.random.normal(jax.random.key(1), (seq, 1, seq))
    v = jnp.eye(seq)[:, None, :]
    step = Step(0)
    dropout = boxwood.nn.Dropout(p)
    both = jax.jit(lambda key: (attend(q, k, v, step, dropout=dropout, key=key),
                                attend(q, k, v, step)))  # fmt: skip
    dropped, plain = (x[:, 0] for x in both(jax.random.key(2)))
    fraction = _kept_fraction(dropped, plain, p)
    assert abs(fraction - (1 - p)) < 0.03  # 2,080 causal entries
    assert not np.asarray(dropped)[np.triu_indices(seq, 1)].any()  # still causal


@pytest.fixture
def fused_calls(monkeypatch):
    calls = []
    real = layers.fused_attention

    def recording(*args, **kwargs):
        calls.append(kwargs["is_causal"])
        return real(*args, **kwargs)

    monkeypatch.setattr(layers, "fused_attention", recording)
    return calls


def test_the_fused_causal_call_stays_where_attention_dropout_is_off(fused_calls):
    model = _gpt2(attn_pdrop=0.0)  # embeddings and residuals dropped
    jax.make_jaxpr(lambda ids, key: model(ids, key=key))(IDS, jax.random.key(0))
    assert fused_calls == [True]
    off = boxwood.nn.inference_mode(_gpt2())
    jax.make_jaxpr(off)(IDS)
    assert fused_calls == [True, True]
    jax.make_jaxpr(lambda ids, key: _gpt2()(ids, key=key))(IDS, jax.random.key(0))
    assert fused_calls == [True, True]  # attention dropout: the explicit softmax


def test_generate_runs_in_inference():
    model = _gpt2()
    out = bm.generate(model, IDS[:4], 3)
    same = bm.generate(boxwood.nn.inference_mode(model), IDS[:4], 3)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(same))


def test_attention_dropout_on_bfloat16_weights_under_strict_promotion():
    """Active attention dropout forms the weights in float32 from bfloat16 heads;
    that widening is explicit, so it holds under the suite's strict promotion, and
    the gradient comes back in the parameters' bfloat16."""
    # cast in one program (eagerly, each leaf's shape compiles a cast of its own)
    model = boxwood.filter_jit(boxwood.cast_floating)(_gpt2(), jnp.bfloat16)
    floats, static = boxwood.partition(model, boxwood.is_inexact_array)

    def loss(floats):
        model = boxwood.combine(floats, static)
        return bm.causal_lm_loss(model, IDS[None], key=jax.random.key(1))

    value, grads = jax.jit(jax.value_and_grad(loss))(floats)
    assert np.isfinite(float(value))
    assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.bfloat16)}
