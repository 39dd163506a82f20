"""How far the backward pass of a checkpointed `while_loop` advances before storing
a state (binomial checkpointing, as in Griewank's `revolve`).

To reverse `L` steps from a stored state with `s` free slots (counting the slot of
that state), let `t` be the least number of recomputations with
`beta(s, t) = C(s + t, s) >= L`. Advancing `m = max(1, L - beta(s - 1, t))` steps
and storing the state reached splits the problem into `L - m` steps with `s - 1`
slots and `m` steps with `s` slots, both within `t` recomputations per step: the
least number of recomputations possible. With one slot (`s == 1`) nothing can be
stored, and each step is recomputed from the stored state.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_MAX = int(np.iinfo(np.int32).max)


def _scale(x: Any, mul: Any, div: Any) -> Any:
    """`x * mul // div`, exact (the binomials below divide exactly), saturating at
    int32's maximum instead of overflowing."""
    overflows = x > _MAX // mul
    return jnp.where(overflows, _MAX, (jnp.where(overflows, 0, x) * mul) // div)


def advance_by(length: Any, slots: Any) -> Any:
    """Steps to advance before storing a state, to reverse `length >= 2` steps with
    `slots >= 2` free slots (see the module docstring)."""

    def more(state: tuple) -> Any:
        _, b, _ = state
        return b < length

    def grow(state: tuple) -> tuple:
        t, b, b_fewer = state  # beta(slots, t), beta(slots - 1, t)
        return (
            t + 1,
            _scale(b, slots + t + 1, t + 1),
            _scale(b_fewer, slots + t, t + 1),
        )

    one = jnp.ones_like(length)
    _, _, b_fewer = jax.lax.while_loop(more, grow, (0 * one, one, one))
    return jnp.maximum(1, length - b_fewer)
