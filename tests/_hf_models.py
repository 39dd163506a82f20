"""Tiny random `transformers` models saved with `save_pretrained`, for the tests of
`boxwood.models` (2 layers, a few dozen channels: built in well under a second)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON = dict(
    num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64
)
TOKENS = dict(vocab_size=97, bos_token_id=1, eos_token_id=2, pad_token_id=0)

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
