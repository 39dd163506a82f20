"""`resize_token_embeddings`: a model whose vocabulary has another number of
tokens, its kept rows unchanged and its new rows drawn as the family draws a
new model's, as `transformers`' `resize_token_embeddings(n, mean_resizing=False)`
makes them."""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from .._init import split_keys
from .._module import Module
from .._tree import tree_at
from . import _training as training
from ._blocks import with_fields


class Vocabulary(Module):
    """The base of `Pretrained` that resizes a model's vocabulary. A subclass
    names its vocabulary arrays in `VOCABULARY`."""

    # The arrays whose leading axis is the vocabulary, `(attribute path, how
    # `resize_token_embeddings` draws new rows)`: `"embedding"` (`N(0,
    # initializer_range)`, the row `pad_token_id` zero as a padding index starts
    # it), `"normal"` (no padding row: GPT-2's table, an untied `lm_head`) or
    # `"zeros"` (an output bias). A path to `None` (a tied `lm_head`) is skipped.
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = ()

    def resize_token_embeddings(self, new_num_tokens: int, *, key: Any = None) -> Any:
        """A copy whose vocabulary has `new_num_tokens` tokens, as `transformers`'
        `model.resize_token_embeddings(new_num_tokens, mean_resizing=False)`
        makes it (after adding tokens to a tokenizer): the token embedding's
        first rows kept (all of them when it grows, the first `new_num_tokens`
        when it shrinks), the new rows drawn as the family draws a new model's
        (`N(0, initializer_range)`, a padding row `pad_token_id` among them
        zero). A tied output projection stays the token embedding; an untied
        one (Llama's `lm_head`) is resized the same way, and BERT's masked-LM
        output bias gets zeros. `config.vocab_size` is the new size (also in a
        head's body), so the new ids are valid inputs.

        **Arguments:**

        - `new_num_tokens`: the new vocabulary size.
        - `key`: a `jax.random` key for the new rows (keyword only); default
          `jax.random.key(0)`, as `from_pretrained` draws a new head.

        **Returns:** the resized model (a new one: this one is unchanged).
        """
        return resized_vocabulary(self, new_num_tokens, key)


def _at(model: Any, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), model)


def resized_vocabulary(model: Any, new_num_tokens: Any, key: Any) -> Any:
    """`model` with each array of `type(model).VOCABULARY` (`(path, init)`
    pairs, the vocabulary along the leading axis; a path to `None`, such as a
    tied `lm_head`, skipped) cut or grown to `new_num_tokens` rows, and
    `vocab_size` set in its config and its bodies' (see
    `Pretrained.resize_token_embeddings`)."""
    name = f"{type(model).__name__}.resize_token_embeddings"
    if isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int):
        raise TypeError(
            f"{name}: `new_num_tokens` must be an int (the new vocabulary size), "
            f"got {type(new_num_tokens).__name__}."
        )
    if new_num_tokens < 1:
        raise ValueError(
            f"{name}: `new_num_tokens` must be at least 1, got {new_num_tokens}."
        )
    parts = [(p, i) for p, i in type(model).VOCABULARY if _at(model, p) is not None]
    if not parts:
        raise TypeError(
            f"{name}: {type(model).__name__} has no token embeddings (it reads no "
            "token ids), so there is no vocabulary to resize."
        )
    config = model.config
    keys = split_keys(jax.random.key(0) if key is None else key, len(parts))
    for (path, init), k in zip(parts, keys, strict=True):
        table = _resized(_at(model, path), new_num_tokens, init, config, k)
        model = tree_at(lambda m, p=path: _at(m, p), model, table)
    return _with_vocab_size(model, new_num_tokens)


def _resized(old: Any, rows: int, init: str, config: Any, key: Any) -> Any:
    """`old`'s first `rows` rows, and after them (where `rows` is more) new
    ones drawn as `init` says."""
    have = old.shape[0]
    if rows <= have:
        return old[:rows]
    shape = (rows - have, *old.shape[1:])
    if init == "zeros":
        fresh = jnp.zeros(shape, old.dtype)
    else:
        std = config.initializer_range
        fresh = training.draw(training.normal(std), key, shape, old.dtype)
    table = jnp.concatenate([old, fresh.astype(old.dtype)])
    pad = config.pad_token_id if init == "embedding" else None
    if pad is not None and have <= pad < rows:  # a new padding row starts at zero
        table = table.at[pad].set(0)
    return table


def _with_vocab_size(module: Any, size: int) -> Any:
    """`module` with `vocab_size` set in its `config` and in its fields' that
    have one (a head's body: BERT's `bert` checks ids against its own)."""
    for field in dataclasses.fields(module):
        value = getattr(module, field.name)
        if hasattr(value, "config") and hasattr(value.config, "vocab_size"):
            get = operator.attrgetter(field.name)
            module = tree_at(get, module, _with_vocab_size(value, size))
    config = dataclasses.replace(module.config, vocab_size=size)
    return with_fields(module, config=config)
