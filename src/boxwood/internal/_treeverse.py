"""How far the backward pass of a checkpointed `while_loop` advances before storing
a state (binomial checkpointing, as in Griewank's `revolve`).

To reverse `L` steps from a stored state with `s` free slots (counting the slot of
that state), let `t` be the least number of recomputations with
`beta(s, t) = C(s + t, s) >= L`. Advancing `m = max(1, L - beta(s - 1, t))` steps
and storing the state reached splits the problem into `L - m` steps with `s - 1`
slots and `m` steps with `s` slots, both within `t` recomputations per step: the
least number of recomputations possible. With one slot (`s == 1`) nothing can be
stored, and each step is recomputed from the stored state.

`Planner` answers without a loop, so that the backward pass is one `while` loop:
the binomials `beta(s, t)` are a constant table, built at trace time, of each row
`s >= 2` up to the first value reaching the longest possible `L` (`max_steps`, or
int32's maximum). Row 2 grows like `sqrt(2 L)` (65,536 entries for int32), so `t`
for `s == 2` comes from the closed form `beta(2, t) = (t + 1)(t + 2) / 2`
instead, and the row is kept only as far as row 3 needs it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_MAX = int(np.iinfo(np.int32).max)


def _row(s: int, longest: int) -> list[int]:
    """`beta(s, 0), beta(s, 1), ...` up to the first value `>= longest`, each
    capped at int32's maximum."""
    values, t, b = [1], 0, 1
    while b < longest:
        t += 1
        b = b * (s + t) // t
        values.append(min(b, _MAX))
    return values


# Row 2 joins the table (rather than the closed form answering for it) while it has
# at most this many entries: up to about 8 million steps.
_ROW2_IN_TABLE = 4096


def _get(x: Any, i: Any) -> Any:
    """`x[i]` for an index known to be in bounds (no wrapping of negative ones)."""
    start = (i,) + (0,) * (x.ndim - 1)
    row = jax.lax.dynamic_slice(
        x, start, (1, *x.shape[1:]), allow_negative_indices=False
    )
    return jax.lax.squeeze(row, (0,))


@functools.lru_cache(maxsize=64)
def _table(slots: int, longest: int) -> tuple:
    """`(flat, offsets, lengths, closed_form)`: rows `2 .. slots` of `beta` end to
    end, `offsets[s]` and `lengths[s]` where row `s` lies in `flat`; with
    `closed_form`, row 2 is cut to the length of row 3 (`t` for `s == 2` then
    comes from the closed form)."""
    rows = {s: _row(s, longest) for s in range(2, slots + 1)}
    closed_form = len(rows[2]) > _ROW2_IN_TABLE
    if closed_form:
        rows[2] = rows[2][: len(rows.get(3, [1]))]
    offsets, lengths, flat = [0] * (slots + 1), [0] * (slots + 1), []
    for s in sorted(rows):
        offsets[s], lengths[s] = len(flat), len(rows[s])
        flat.extend(rows[s])
    searched = range(3 if closed_form else 2, slots + 1)
    width = max([lengths[s] for s in searched], default=1)
    flat.extend([_MAX] * width)  # a slice starting in the last row stays in bounds
    as_int = lambda xs: np.asarray(xs, np.int32)  # noqa: E731
    return as_int(flat), as_int(offsets), as_int(lengths), width, closed_form


def _triangle_at_least(u: Any, length: Any) -> Any:
    """`u (u + 1) / 2 >= length`, exact for `1 <= u <= 65536`: compared as
    `u (u + 1) >= 2 length` in uint32, where only `u = 65536` (always true for an
    int32 `length`) would overflow."""
    u32 = u.astype(jnp.uint32)
    twice = length.astype(jnp.uint32) * jnp.uint32(2)
    return (u >= 65536) | (u32 * (u32 + jnp.uint32(1)) >= twice)


def _least_t_two_slots(length: Any) -> Any:
    """The least `t` with `beta(2, t) = (t + 1)(t + 2) / 2 >= length`: the root of
    the quadratic in float32 (within one of the answer), then corrected exactly."""
    root = (jnp.sqrt(8.0 * length.astype(jnp.float32) + 1.0) - 1.0) / 2.0
    u = jax.lax.clamp(2, jnp.ceil(root).astype(jnp.int32), 65536)  # u = t + 1
    u = jax.lax.select(_triangle_at_least(u - 1, length), u - 1, u)
    u = jax.lax.select(_triangle_at_least(u, length), u, u + 1)
    return u - 1


class Planner:
    """`advance_by(length, slots)` for a loop with `slots` checkpoints and at most
    `longest` steps (see the module docstring)."""

    def __init__(self, slots: int, longest: int) -> None:
        self.slots = max(slots, 2)
        table = _table(self.slots, max(int(longest), 2))
        self.flat, self.offsets, self.lengths, self.width, self.closed_form = table

    def least_t(self, length: Any, s: Any) -> Any:
        """The least `t` with `beta(s, t) >= length`, for `2 <= s <= slots`."""
        start = _get(jnp.asarray(self.offsets), s)
        row = jax.lax.dynamic_slice(jnp.asarray(self.flat), (start,), (self.width,))
        in_row = jnp.arange(self.width, dtype=jnp.int32) < _get(
            jnp.asarray(self.lengths), s
        )
        t = jnp.sum(in_row & (row < length), dtype=jnp.int32)
        if not self.closed_form:
            return t
        return jax.lax.select(s == 2, _least_t_two_slots(length), t)

    def beta_fewer(self, s: Any, t: Any) -> Any:
        """`beta(s - 1, t)`, for `t` the least one `least_t(length, s)` gives."""
        index = _get(jnp.asarray(self.offsets), jax.lax.max(s - 1, 2)) + t
        return jax.lax.select(s == 2, t + 1, _get(jnp.asarray(self.flat), index))

    def advance_by(self, length: Any, slots: Any) -> Any:
        """Steps to advance before storing a state, to reverse `length >= 2` steps
        with `2 <= slots <= self.slots` free slots; other arguments give an
        unspecified number (the caller does not use it)."""
        length = jax.lax.max(jnp.asarray(length, jnp.int32), 2)
        s = jax.lax.clamp(2, jnp.asarray(slots, jnp.int32), self.slots)
        t = self.least_t(length, s)
        return jax.lax.max(1, length - self.beta_fewer(s, t))
