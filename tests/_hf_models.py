"""Tiny random `transformers` models saved with `save_pretrained`, for the tests of
`boxwood.models` (2 layers, a few dozen channels: built in well under a second).

`WIDE` draws the weights wide enough that activations leave their linear regime
(pre-activations of a few units), so that a wrong activation or normalisation
shows in the outputs; `transformers`' default (0.02) keeps every GELU nearly
linear, where the tanh and exact forms agree to 1e-6.

`shared_tiny` and `shared_model` build each (kind, options) once per test process
(one pytest-xdist worker) and hand the same checkpoint, PyTorch model and boxwood
model to every test that asks: tests must not change them (boxwood models are
immutable; the PyTorch models are only called, in `eval` mode, without gradients),
and copy a checkpoint directory before changing a file in it."""

import atexit
import functools
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# PyTorch runs on one thread here: tests/conftest.py sets OMP_NUM_THREADS=1.

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


@functools.cache
def _scratch_root():
    root = tempfile.mkdtemp(prefix="boxwood-tiny-models-")
    atexit.register(shutil.rmtree, root, True)
    return pathlib.Path(root)


_SHARED = {}


def _options_key(kind, options):
    return kind, repr(sorted(options.items()))


def scratch_directory(prefix):
    """A new directory that lasts as long as the test process."""
    return pathlib.Path(tempfile.mkdtemp(dir=_scratch_root(), prefix=prefix))


def shared_tiny(kind, **options):
    """`(directory, reference)`: `save_tiny(kind, directory, **options)`, built once
    per process. Read the directory only (copy it to change a file)."""
    key = _options_key(kind, options)
    if key not in _SHARED:
        directory = scratch_directory(kind)
        _SHARED[key] = directory, save_tiny(kind, directory, **options)
    return _SHARED[key]


_LOADED = {}


def shared_model(kind, **options):
    """`(model, reference)`: boxwood's `from_pretrained` of `shared_tiny(kind,
    **options)`'s checkpoint, loaded once per process, and the PyTorch model."""
    key = _options_key(kind, options)
    if key not in _LOADED:
        import boxwood.models as bm

        directory, reference = shared_tiny(kind, **options)
        _LOADED[key] = bm.from_pretrained(directory), reference
    return _LOADED[key]


@functools.cache
def generation_pair(kind):
    """`shared_model` of a GPT-2 or a Llama (grouped-query, untied) drawn wide
    enough (0.3) that greedy continuations are varied (with the default 0.02 they
    quickly repeat one token): the models of the `generate` tests. The boxwood
    model is given without the `generation_config.json` `transformers` wrote, whose
    end token (2) would otherwise be `generate`'s default: the tests run to
    `max_new_tokens` unless they pass an end token."""
    import dataclasses

    from boxwood.models._blocks import with_fields

    options = dict(initializer_range=0.3)
    if kind == "llama":
        options.update(num_key_value_heads=2, tie_word_embeddings=False)
    model, reference = shared_model(kind, **options)
    config = dataclasses.replace(model.config, generation_config=None)
    return with_fields(model, config=config), reference


def copy_checkpoint(source, destination):
    """`destination`: a new directory with copies of `source`'s JSON files
    (`config.json`, `generation_config.json`, ...: free to change) and hard links
    to its other files (the weights: cheap; replace those, never write into
    them, or the shared checkpoint changes with them)."""
    destination = pathlib.Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    for path in pathlib.Path(source).iterdir():
        if path.suffix == ".json":
            shutil.copy(path, destination / path.name)
        else:
            (destination / path.name).hardlink_to(path)
    return destination
