"""A generation step (one new token over the key/value cache) runs the stacked
layers one after the other with static indices: its program holds no loop over
the layers and reads each layer's weights and cache with static slices, while a
prompt (several tokens) and training keep the one scan. The step computes what
the full forward pass computes at that position."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.models as bm
from _jaxprs import all_equations

LLAMA = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
)  # fmt: skip
MODELS = {
    "gpt2": lambda: bm.GPT2LMHeadModel(
        bm.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64, n_positions=32),
        key=jax.random.key(0),
    ),
    "llama": lambda: bm.LlamaForCausalLM(
        bm.LlamaConfig(**LLAMA), key=jax.random.key(1)
    ),
    # a window on the last layer only: the windows are per-layer data
    "qwen2 windows": lambda: bm.Qwen2ForCausalLM(
        bm.Qwen2Config(
            **LLAMA, use_sliding_window=True, sliding_window=3, max_window_layers=2
        ),
        key=jax.random.key(2),
    ),
}


def _primitives(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return collections.Counter(e.primitive.name for e in all_equations(jaxpr.jaxpr))


@pytest.mark.parametrize("kind", MODELS)
def test_one_token_step_is_unrolled_and_matches_the_forward_pass(kind):
    model = bw.nn.inference_mode(MODELS[kind]())
    ids = jnp.asarray([5, 9, 2, 7, 11, 3], jnp.int32)
    decode = bw.filter_jit(lambda m, ids, s, start: m.decode(ids, s, start))

    step = _primitives(
        lambda m, s: m.decode(ids[5:], s, jnp.int32(5)), model, model.init_cache(8)
    )
    assert not {"scan", "while"} & set(step), step
    # weights and cache rows are static slices: no dynamic slice at all
    assert step["dynamic_slice"] == 0, step
    prompt = _primitives(
        lambda m, s: m.decode(ids[:5], s, jnp.int32(0)), model, model.init_cache(8)
    )
    assert prompt["scan"] == 1, prompt

    _, state = decode(model, ids[:5], model.init_cache(8), jnp.int32(0))
    stepped, _ = decode(model, ids[5:], state, jnp.int32(5))
    full = bw.filter_jit(lambda m, ids: m(ids))(model, ids)
    np.testing.assert_allclose(
        np.asarray(stepped[0]), np.asarray(full[5]), rtol=1e-5, atol=1e-5
    )


def test_a_call_without_a_cache_slices_the_position_embedding():
    # positions 0..seq-1 are a slice of GPT-2's `wpe`: its gradient is a pad, not
    # a scatter-add of every row (the token embedding's lookup scatters; the
    # loss's gradient compares the targets with the vocabulary's indices)
    model = bw.nn.inference_mode(MODELS["gpt2"]())
    ids = jnp.asarray([[5, 9, 2, 7], [1, 3, 3, 8]], jnp.int32)
    grads = _primitives(bw.filter_grad(bm.causal_lm_loss), model, ids)
    assert grads["scatter-add"] == 1, grads
    # the same rows as gathering them
    wpe = model.transformer.wpe.weight
    step = bm._attend.Step(0)
    np.testing.assert_array_equal(step.position_rows(wpe, 4), wpe[jnp.arange(4)])
    # past the table, or from a traced start, the rows are gathered as before
    assert step._replace(start=30).position_rows(wpe, 4).shape == (4, 32)
    traced = jax.make_jaxpr(lambda s: step._replace(start=s).position_rows(wpe, 4))
    assert "gather" in str(traced(jnp.int32(2)))


def test_one_token_attention_in_bfloat16_under_strict_promotion():
    # the suite runs with `jax_numpy_dtype_promotion="strict"`, where
    # `jnp.promote_types(bfloat16, float32)` raises: the sums' dtype is chosen
    # without it (`wide_dtype`), so a bfloat16 model's decoding step works there
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (1, 4, 8))
    k, v = (jax.random.normal(key, (5, 2, 8)) for key in keys[1:])
    visible = jnp.arange(5) < 4
    low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    with jax.numpy_dtype_promotion("strict"):
        got = bm._attend._one_token(*low, visible)
    assert got.dtype == jnp.bfloat16
    expected = bm._attend._one_token(q, k, v, visible)
    np.testing.assert_allclose(got.astype(jnp.float32), expected, atol=3e-2)
    assert bm._attend.wide_dtype(jnp.float64) == jnp.float64
    assert bm._attend.wide_dtype(jnp.bfloat16) == jnp.float32
