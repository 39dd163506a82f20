"""Tiny causal language models built from scratch (random weights), one build per
configuration and process (models are immutable), for the structural tests of
`boxwood.models`: attention, stacked layers. GPT-2 is switched to inference mode
(its config's dropout rates are nonzero)."""

import functools

import jax

import boxwood
import boxwood.models as bm

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64)
SMALL_LLAMA = dict(
    **SMALL, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64
)


@functools.cache
def gpt2(layers=2):
    config = bm.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=layers, n_head=4
    )
    return boxwood.nn.inference_mode(bm.GPT2LMHeadModel(config, key=jax.random.key(0)))


@functools.cache
def llama(layers=2):
    config = bm.LlamaConfig(**SMALL_LLAMA, num_hidden_layers=layers)
    return bm.LlamaForCausalLM(config, key=jax.random.key(1))


@functools.cache
def mistral():
    config = bm.MistralConfig(**SMALL_LLAMA, num_hidden_layers=2, sliding_window=3)
    return bm.MistralForCausalLM(config, key=jax.random.key(2))


@functools.cache
def qwen2_mixed():
    """Qwen2 with a sliding window in its first layer only (mixed windows)."""
    config = bm.Qwen2Config(
        **SMALL_LLAMA,
        num_hidden_layers=3,
        use_sliding_window=True,
        sliding_window=3,
        max_window_layers=1,
    )
    return bm.Qwen2ForCausalLM(config, key=jax.random.key(3))
