"""Tiny random `transformers` models saved with `save_pretrained`, for the tests of
`boxwood.models` (2 layers, a few dozen channels: built in well under a second).

`WIDE` draws the weights wide enough that activations leave their linear regime
(pre-activations of a few units), so that a wrong activation or normalisation
shows in the outputs; `transformers`' default (0.02) keeps every GELU nearly
linear, where the tanh and exact forms agree to 1e-6."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON = dict(
    num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64
)
TOKENS = dict(vocab_size=97, bos_token_id=1, eos_token_id=2, pad_token_id=0)

WIDE = dict(initializer_range=0.4)

CONFIGS = {
    "gpt2": lambda **kw: transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        n_positions=64,
        vocab_size=97,
        bos_token_id=1,
        eos_token_id=2,
        **kw,
    ),
    "llama": lambda **kw: transformers.LlamaConfig(
        **COMMON, **TOKENS, max_position_embeddings=64, **kw
    ),
    "mistral": lambda **kw: transformers.MistralConfig(
        **COMMON,
        **TOKENS,
        max_position_embeddings=64,
        num_key_value_heads=2,
        sliding_window=4,
        **kw,
    ),
    "qwen2": lambda **kw: transformers.Qwen2Config(
        **COMMON, **TOKENS, max_position_embeddings=64, num_key_value_heads=2, **kw
    ),
    "gemma": lambda **kw: transformers.GemmaConfig(
        **COMMON,
        **TOKENS,
        max_position_embeddings=64,
        num_key_value_heads=2,
        head_dim=8,
        **kw,
    ),
    "bert": lambda **kw: transformers.BertConfig(
        **COMMON, **TOKENS, max_position_embeddings=64, **kw
    ),
    "vit": lambda **kw: transformers.ViTConfig(
        **COMMON, image_size=16, patch_size=4, num_labels=5, **kw
    ),
}
CLASSES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "bert": "BertModel",
    "vit": "ViTForImageClassification",
}


def save_tiny(kind, directory, seed=0, dtype=None, max_shard_size=None, **options):
    """Build a random tiny `kind` model in PyTorch, save it to `directory`, return it."""
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[kind])(CONFIGS[kind](**options)).eval()
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(directory), **kwargs)
    return model


def token_ids(seed, shape, vocab=97):
    return np.random.RandomState(seed).randint(3, vocab, size=shape)
