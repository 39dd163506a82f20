"""The prompts of a `generate` call laid out in one array for its compiled loop
(lengths padded to buckets), and the loop's new tokens joined to them."""

from __future__ import annotations

import inspect
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

# Prompts and new-token counts are padded to the next power of two (at least
# this), so that nearby lengths share one compiled program.
MIN_BUCKET = 16


def bucket(length: int) -> int:
    """The padded length: the next power of two, at least `MIN_BUCKET`."""
    return max(MIN_BUCKET, 1 << (length - 1).bit_length())


def layout(
    name: str, model: Any, prompts: list[np.ndarray], pad_id: int
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The prompts in one `(batch, bucket)` host array and the slot of the first new
    token. Prompts of one length are right-padded (the causal mask hides the
    padding and the new tokens overwrite it); prompts of several lengths are
    left-padded, each row's padding given to `decode` as `pad`."""
    lengths = {len(p) for p in prompts}
    longest = max(lengths)
    width = min(bucket(longest), model.max_positions)
    padded = np.full((len(prompts), width), pad_id, np.int32)
    if len(lengths) == 1:
        padded[:, :longest] = np.stack(prompts)
        return padded, None, longest
    if "pad" not in inspect.signature(model.decode).parameters:
        raise TypeError(
            f"`generate`: {name}.decode takes no `pad`, which prompts of different "
            "lengths need; give prompts of one length, or one at a time."
        )
    for row, prompt in zip(padded, prompts):
        row[width - len(prompt) :] = prompt
    pads = np.asarray([width - len(p) for p in prompts], np.int32)
    return padded, pads, width


def joined(
    prompts: list[np.ndarray], new: np.ndarray, pad_id: int, single: bool
) -> Array:
    """The prompts followed by their new tokens, joined on the host (a device
    concatenation would compile once per length)."""
    if single:
        return jnp.asarray(np.concatenate([prompts[0], new[0]]))
    longest = max(len(p) for p in prompts)
    out = np.full((len(prompts), longest + new.shape[1]), pad_id, np.int32)
    for row, prompt in zip(out, prompts):
        row[longest - len(prompt) : longest] = prompt
    out[:, longest:] = new
    return jnp.asarray(out)
