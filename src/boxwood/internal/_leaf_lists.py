"""Small tools of the checkpointed `while_loop` on flat lists of leaves and on
arrays of stored states, shared by its forward pass (`_checkpointed.py`) and its
backward pass (`_reversal.py`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import custom_batching
from jax.custom_derivatives import SymbolicZero

MAX_STEPS = int(jnp.iinfo(jnp.int32).max)  # steps are counted in int32


def is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero)


def pick(xs: list, flags: list) -> list:
    return [x for x, f in zip(xs, flags) if f]


def get(x: Any, i: Any) -> Any:
    """`x[i]` for an index known to be in bounds (no wrapping of negative ones)."""
    start = (i,) + (0,) * (x.ndim - 1)
    row = jax.lax.dynamic_slice(
        x, start, (1, *x.shape[1:]), allow_negative_indices=False
    )
    return jax.lax.squeeze(row, (0,))


def put(x: Any, i: Any, value: Any) -> Any:
    """`x.at[i].set(value)` for an index known to be in bounds."""
    start = (i,) + (0,) * (x.ndim - 1)
    row = jax.lax.expand_dims(jax.lax.convert_element_type(value, x.dtype), (0,))
    return jax.lax.dynamic_update_slice(x, row, start, allow_negative_indices=False)


def merge(flags: list, chosen: list, others: list) -> list:
    """Interleave: `chosen` where `flags` is true, `others` elsewhere, in order."""
    chosen_it, others_it = iter(chosen), iter(others)
    return [next(chosen_it) if f else next(others_it) for f in flags]


@custom_batching.custom_vmap
def running(go: Any) -> Any:
    """Whether an iteration that a loop runs is live: `go` itself for the batch
    elements of a `vmap`, but `True` without one, since a loop that is not batched
    runs its body only while `go` holds. So the selects and gated writes of an
    iteration fold away where nothing is batched. (`go` must be the condition the
    loop runs under, or imply it.)"""
    return jnp.ones_like(go)


@running.def_vmap
def _running_batched(axis_size: int, in_batched: list, go: Any) -> tuple:
    del axis_size
    if in_batched[0]:
        return go, True
    return running(go), False  # an enclosing `vmap` may batch it
