"""The checks of a model call's inputs: `input_ids` (shape, dtype, length, ids
within the vocabulary) and `attention_mask` (its shape and its 0/1 values): eager
`ValueError`s on concrete inputs, `boxwood.error_if` under a trace; and the
warning of `generate` on prompts that look right-padded."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._errors import error_if
from .._warnings import user_stacklevel
from ._id_ranges import check_ids_below, known_in_range


def check_input_ids(
    model: str, input_ids: Any, max_length: int | None, vocab_size: int | None = None
) -> Any:
    """`input_ids` must be a 1-D integer array (or a list of ints), not empty, no
    longer than the position table, of ids in `[0, vocab_size)`. Returns
    `input_ids` (a list as a NumPy array): under a trace the id check is
    attached to the returned array (`boxwood.error_if`), so use it."""
    if isinstance(input_ids, list | tuple):
        input_ids = np.asarray(input_ids)
    if jnp.ndim(input_ids) == 1 and jnp.shape(input_ids)[0] == 0:
        raise ValueError(f"{model}: `input_ids` is empty; give at least one token.")
    dtype = jnp.result_type(input_ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(
            f"{model}: `input_ids` must be an integer array of token ids, got dtype "
            f"{dtype}. Convert it with `input_ids.astype(jnp.int32)`."
        )
    if jnp.ndim(input_ids) != 1:
        raise ValueError(
            f"{model}: `input_ids` must have shape (seq,) (one sequence: boxwood "
            f"layers act on one example), got shape {jnp.shape(input_ids)}. For a "
            "batch use `jax.vmap(model)(input_ids)`."
        )
    length = jnp.shape(input_ids)[0]
    if max_length is not None and length > max_length:
        raise ValueError(
            f"{model}: `input_ids` has {length} tokens, more than the model's "
            f"{max_length} positions (`max_position_embeddings`/`n_positions` in its "
            "config)."
        )
    if vocab_size is None:
        return input_ids
    return _ids_in_vocabulary(model, input_ids, vocab_size)


def check_attention_mask(model: str, attention_mask: Any, shape: tuple) -> Any:
    """`attention_mask` (an array or lists) must have `input_ids`' `shape` and hold
    only 1 (a real token) and 0 (padding), as booleans or numbers. Returns it
    as an array: under a trace the value check is attached to it
    (`boxwood.error_if`, left out inside `ids_known_in_range()`), so use it."""
    if isinstance(attention_mask, list | tuple):
        attention_mask = np.asarray(attention_mask)
    dtype = jnp.result_type(attention_mask)
    if not (
        dtype == jnp.bool_
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.floating)
    ):
        raise TypeError(
            f"{model}: `attention_mask` must be an array of 1 (real token) and 0 "
            f"(padding), got dtype {dtype}."
        )
    if tuple(jnp.shape(attention_mask)) != tuple(shape):
        raise ValueError(
            f"{model}: `attention_mask` has shape {jnp.shape(attention_mask)}, but "
            f"`input_ids` has shape {tuple(shape)}; give one entry per token (1 real, "
            "0 padding)."
        )
    if dtype == jnp.bool_:
        return attention_mask
    rule = f"{model}: `attention_mask` must hold only 1 (a real token) and 0 (padding)"
    if isinstance(attention_mask, jax.core.Tracer):
        if known_in_range():
            return attention_mask
        bad = (attention_mask != 0) & (attention_mask != 1)
        checked: Any = error_if(attention_mask, bad, f"{rule}; got another value.")
        return checked
    values = np.asarray(attention_mask)
    where = np.flatnonzero((values != 0) & (values != 1))
    if where.size:
        first = int(where[0])
        at = tuple(int(i) for i in np.unravel_index(first, values.shape))
        raise ValueError(
            f"{rule}; got {values.reshape(-1)[first].item()!r} at position "
            f"{at[0] if len(at) == 1 else at}."
        )
    return attention_mask


def _ids_in_vocabulary(model: str, input_ids: Any, vocab_size: int) -> Any:
    """Without this check an id past the table would read its last row (JAX clamps
    gathers) and a negative one would wrap around."""
    rule = (
        f"{model}: `input_ids` must hold token ids from 0 to {vocab_size - 1} (the "
        f"vocabulary has {vocab_size} tokens, `vocab_size` in the config)"
    )
    return check_ids_below(
        model, "input_ids", input_ids, vocab_size, "vocab_size", rule
    )


def warn_right_padding(prompts: list[np.ndarray], pad_token_id: Any) -> None:
    """`generate`'s warning (as `transformers`') where rows of a batch given
    without an `attention_mask` end with `pad_token_id`: right padding, which
    is read as part of the prompt, so the new tokens would follow the pads."""
    if not isinstance(pad_token_id, int | np.integer):
        return
    rows = [i for i, p in enumerate(prompts) if len(p) and p[-1] == pad_token_id]
    if not rows:
        return
    shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    warnings.warn(
        f"`generate`: {'rows' if len(rows) > 1 else 'row'} {shown} of "
        f"`input_ids` {'end' if len(rows) > 1 else 'ends'} with `pad_token_id` = "
        f"{pad_token_id}: right padding was detected. "
        "Without an `attention_mask` the pads are read as part of the prompt and "
        "the new tokens follow them. Pass the tokenizer's `attention_mask=` (left "
        "or right padding is then taken out), pad on the left, or give the "
        "prompts unpadded as a list.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
