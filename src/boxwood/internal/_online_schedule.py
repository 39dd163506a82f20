"""Where the forward pass of a checkpointed `while_loop` keeps its states, when the
number of steps is not known in advance (online checkpointing).

There are `c` slots. State `i` is the loop's carry before step `i`; at each step
the schedule says which slot state `i` goes into (evicting what was there), or that
it is not stored (`slot == c`, a scratch slot nobody reads). Phase 1 costs O(1)
per step, phase 2 O(c); up to `_ALWAYS_BOTH` slots phase 2's update is computed
(and discarded) during phase 1 too, which compiles faster than a conditional.

**Phase 1, up to `beta(c, 2) = (c + 1)(c + 2) / 2` steps (Stumm and Walther's online
checkpointing).** The steps are cut into runs `k = 0, 1, ..., c`; run `k` starts
at `start(k) = k (c + 1) - k (k - 1) / 2` and is `c - k + 1` steps long. Its first
`c - k` states are stored and its last one is not. Run 0 fills slots `0 .. c-1` in
order. In run `k >= 1`, state `start(k) + o` goes into slot `o` for `o >= 1`, and
its first state into slot `c - k`: the states of run `k - 1` are evicted last one
first, then from the front, and the first state of every run stays. Whatever the
number of steps `n <= beta(c, 2)`, the states kept let the backward pass (see
`_treeverse.py`) recompute every step at most twice, which is optimal for `n`
known in advance.

**Phase 2, after `beta(c, 2)` steps (Wang, Moin and Iaccarino's dynamic
checkpointing).** Every stored state has a level: the states kept by phase 1 have
level 0, state 0 an infinite one. A stored state is *dispensable* when a later one
has a higher level. Each new state is stored: if some state is dispensable, the
latest dispensable one is evicted and the new state gets level 0; otherwise the
latest state is evicted and the new one gets its level plus one. The number of
recomputations then grows only logarithmically with the number of steps.

For phase 2 the stored states are kept in time order (`order_pos`, `order_level`,
`order_slot`), starting from phase 1's final layout, which is fixed: the first
state of each run `k < c`, in slot `0` for run 0 and slot `c - k` otherwise.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._unvmap import unvmap_any

_INT = jnp.int32
_NO_LEVEL = np.iinfo(np.int32).max  # state 0's level: never dispensable, never evicted
# Up to this many slots, phase 2's update is computed at every step and selected
# (one step of a diffrax solve's gradient then compiles about 10% faster than with
# a `lax.cond` around it, and the update costs a few operations on `c` integers);
# beyond, it runs under a `lax.cond`, only once phase 2 has begun.
_ALWAYS_BOTH = 256


def run_start(c: int, k: int) -> int:
    """The first step of phase 1's run `k` with `c` slots."""
    return k * (c + 1) - k * (k - 1) // 2


def phase1_steps(c: int) -> int:
    """`beta(c, 2)`: how many steps phase 1 lasts."""
    return (c + 1) * (c + 2) // 2


def initial_state(c: int) -> dict:
    """The schedule's part of the forward loop's carry, before step 0."""
    starts = [run_start(c, k) for k in range(c)]
    slots = [0] + [c - k for k in range(1, c)]
    levels = [_NO_LEVEL] + [0] * (c - 1)
    return {
        "run": jnp.asarray(0, _INT),
        "run_start": jnp.asarray(0, _INT),
        "order_pos": jnp.asarray(starts, _INT),
        "order_level": jnp.asarray(levels, _INT),
        "order_slot": jnp.asarray(slots, _INT),
    }


def _phase1(c: int, i: Any, sched: dict, go: Any) -> tuple:
    run, start = sched["run"], sched["run_start"]
    length = c - run + 1
    offset = i - start
    first_slot = jnp.where(run == 0, 0, c - run)
    slot = jnp.where(offset == 0, first_slot, offset)
    # a run's last state is not kept; nor is any state once the runs are over
    slot = jnp.where((offset == length - 1) | (run >= c), c, slot)
    ends = go & (offset == length - 1)
    sched = dict(
        sched,
        run=jnp.where(ends, run + 1, run),
        run_start=jnp.where(ends, start + length, start),
    )
    return slot, sched


def _phase2(c: int, i: Any, sched: dict) -> tuple:
    pos, level, slots = sched["order_pos"], sched["order_level"], sched["order_slot"]
    index = jnp.arange(c, dtype=_INT)
    # The highest level among the states after each one.
    later = jnp.concatenate([level[1:], jnp.full((1,), -1, _INT)])
    later_max = jax.lax.cummax(later, reverse=True)
    dispensable = (index >= 1) & (level < later_max)
    any_dispensable = jnp.any(dispensable)
    latest_dispensable = jnp.max(jnp.where(dispensable, index, -1))
    evict = jnp.where(any_dispensable, latest_dispensable, c - 1)
    new_level = jnp.where(any_dispensable, 0, level[c - 1] + 1)
    slot = slots[evict]
    source = jnp.minimum(jnp.where(index >= evict, index + 1, index), c - 1)
    last = index == c - 1
    sched = dict(
        sched,
        order_pos=jnp.where(last, i, pos[source]),
        order_level=jnp.where(last, new_level, level[source]),
        order_slot=jnp.where(last, slot, slots[source]),
    )
    return slot, sched


def next_slot(
    c: int, i: Any, sched: dict, go: Any, max_steps: int | None = None
) -> tuple:
    """`(slot, sched)`: where state `i` goes (`c`: not kept) and the updated
    schedule state; nothing is kept or changed unless `go` (the step is live).
    A loop of at most `max_steps` steps (if given) that phase 1 covers has no
    phase 2 in its program."""
    slot1, sched1 = _phase1(c, i, sched, go)
    slot1 = jnp.where(go, slot1, c)
    if c == 1 or (max_steps is not None and max_steps <= phase1_steps(c)):
        return slot1, sched1
    in_phase2 = go & (i >= phase1_steps(c))

    def both(_: Any) -> tuple:
        slot2, sched2 = _phase2(c, i, sched)
        pick = lambda a, b: jnp.where(in_phase2, a, b)  # noqa: E731
        return pick(slot2, slot1), jax.tree_util.tree_map(pick, sched2, sched1)

    if c <= _ALWAYS_BOTH:  # a few vector operations on `c` integers per step
        return both(None)
    # Phase 2's O(c) work runs only once some loop (of a `vmap`ped batch) is in it.
    return jax.lax.cond(unvmap_any(in_phase2), both, lambda _: (slot1, sched1), None)
