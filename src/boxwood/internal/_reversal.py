"""The backward pass of the checkpointed `while_loop` (see `_checkpointed.py`):
one `while` loop that either advances from the latest stored state (storing
where `_treeverse` says) or pulls the cotangents back through a step
(`_Reversal`), or, when every state was stored, pulls back step by step
(`_reverse_from_every_state`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._unvmap import unvmap_any
from . import _treeverse
from ._leaf_lists import MAX_STEPS, get, is_zero, merge, pick, put, running
from ._perturbation import nonzero_cotangents


def _stack(pos: Any, c: int) -> tuple:
    """The stored states as a stack in step order: `(order, stack_pos, depth)`:
    `order[:depth]` are the slots in use, `stack_pos[:depth]` their steps, and
    `order[depth:]` the free slots, ending with the scratch slot `c`."""
    used = pos[:c] >= 0
    key = jnp.where(used, pos[:c], jnp.iinfo(jnp.int32).max)
    order = jnp.argsort(key, stable=True).astype(jnp.int32)
    scratch = jnp.full((1,), c, jnp.int32)
    stack_pos = jnp.concatenate([key[order], scratch])
    return jnp.concatenate([order, scratch]), stack_pos, jnp.sum(used, dtype=jnp.int32)


def _linearised_step(
    loop: Any, body_leaves: list, b_pert: list, live: list, leaves: list
) -> tuple:
    """`(out, pull)`: one step from `leaves` (all its output leaves), and the
    function pulling `(cts, ct_body)` back through it: the cotangents of the `live`
    carry leaves, and (added to `ct_body`) of the perturbed body leaves."""

    def one_step(pb: list, lv: list) -> tuple:
        full_body = merge(b_pert, pb, pick(body_leaves, [not p for p in b_pert]))
        full = merge(live, lv, pick(leaves, [not x for x in live]))
        out = loop.step(full_body)(full)
        return pick(out, live), out

    pb, lv = pick(body_leaves, b_pert), pick(leaves, live)
    _, vjp_fn, out = jax.vjp(one_step, pb, lv, has_aux=True)

    def pull(cts_and_body: tuple) -> tuple:
        cts, ct_body = cts_and_body
        d_body, d_leaves = vjp_fn(cts)
        return list(d_leaves), [a + b for a, b in zip(ct_body, d_body)]

    return out, pull


def _reversing(end: Any, at: Any, stack_pos: Any, depth: Any) -> tuple:
    """`(back, end, depth)` after an iteration from the state before step `at`:
    whether it reverses step `end - 1` (`at == end - 1`), the steps then still to
    reverse, and how many states are stored once the state just used is freed
    (if it was stored)."""
    back = at == end - 1
    end = end - back.astype(end.dtype)
    freed = back & (get(stack_pos, jax.lax.max(depth - 1, 0)) == end)
    return back, end, depth - freed.astype(depth.dtype)


def _reload_slot(order: Any, end: Any, at: Any, stack_pos: Any, depth: Any) -> Any:
    """The slot of the state that the next iteration reloads should it reverse a
    step: the latest one stored after it (`_reversing`). It is computed at the end
    of the iteration before and carried, so that the loads of the stored leaves
    share one index, rather than each a copy of this arithmetic (a distinct
    kernel)."""
    _, _, depth = _reversing(end, at, stack_pos, depth)
    return get(order, jax.lax.max(depth - 1, 0))


class _Sweep(NamedTuple):
    """The backward loop's carry."""

    end: Any  # steps still to reverse: the next one is step `end - 1`
    at: Any  # `cur` is the state before step `at`
    cur: list  # its leaves, buffers excepted
    saved: list  # the slots (and the scratch slot `c`) of the stored states
    stack_pos: Any  # the steps of the stored states, in step order
    depth: Any  # how many states are stored
    cts: list  # cotangents of the `live` carry leaves, after step `end - 1`
    ct_body: list  # cotangents of the perturbed body leaves, summed
    reload: Any  # the slot to reload from, should this iteration reverse a step


class _Reversal:
    """The backward pass as one `while` loop. Each iteration runs the step from
    `cur`, linearised. While `cur` is before step `end - 1`, it moves `cur` on to
    the state reached (and stores it where `_treeverse` says); at step `end - 1`
    it pulls the cotangents back through the step instead (the transpose alone is
    under a `lax.cond`), and continues from the latest stored state, freeing its
    slot when it held the state just used. The step is in the program once."""

    def __init__(
        self, loop: Any, body_leaves: list, b_pert: list, live: list, bufs: list
    ) -> None:
        self.loop, self.bufs = loop, bufs
        self.linearised = lambda leaves: _linearised_step(
            loop, body_leaves, b_pert, live, leaves
        )
        longest = MAX_STEPS if loop.max_steps is None else loop.max_steps
        self.planner = _treeverse.Planner(loop.c, longest)

    def with_bufs(self, kept: list) -> list:
        """All the carry's leaves: `kept` and the final buffers. Steps read the
        final buffers, and their writes to them are dropped: each element is
        written once, so the buffers hold those values already."""
        return merge(self.loop.buffer, self.bufs, kept)

    def start(self, n: Any, saved: list, pos: Any, cts: list, ct_body: list) -> tuple:
        order, stack_pos, depth = _stack(pos, self.loop.c)
        top = jax.lax.max(depth - 1, 0)
        at = jax.lax.select(depth > 0, get(stack_pos, top), 0)
        cur = [get(b, get(order, top)) for b in saved]
        reload = _reload_slot(order, n, at, stack_pos, depth)
        return order, _Sweep(n, at, cur, saved, stack_pos, depth, cts, ct_body, reload)

    def target(self, s: _Sweep) -> Any:
        """The step whose state is stored next on the way to `end - 1` (-1: none)."""
        top = get(s.stack_pos, jax.lax.max(s.depth - 1, 0))
        length, free = s.end - top, self.loop.c - s.depth + 1
        m = self.planner.advance_by(length, free)
        return jax.lax.select((length >= 2) & (free >= 2), top + m, -1)

    def one(self, s: _Sweep, order: Any) -> _Sweep:
        # Under `vmap` the loop runs while any batch element has steps left; the
        # others keep `cur`, so that no step sees a state the loop never reached.
        active = running(s.end > 0)
        # reversed: free the top slot if it held the state just used, reload
        back, end, depth = _reversing(s.end, s.at, s.stack_pos, s.depth)
        target = self.target(s)
        out, pull = self.linearised(self.with_bufs(s.cur))
        cts, ct_body = jax.lax.cond(back, pull, lambda c: c, (s.cts, s.ct_body))
        top = jax.lax.max(depth - 1, 0)
        stored = [get(b, s.reload) for b in s.saved]
        cur = [
            jax.lax.select(back, x, jax.lax.select(active, y, z))
            for x, y, z in zip(stored, self.loop.kept(out), s.cur, strict=True)
        ]
        at = jax.lax.select(
            back, get(s.stack_pos, top), s.at + active.astype(s.at.dtype)
        )
        store = active & ~back & (at == target)
        # `cur` is written to the first free slot (the scratch slot when none is
        # free) whether or not it is kept there: the index depends on `depth`
        # alone, and `store` only decides whether the stack grows to include it.
        saved = [
            put(b, get(order, s.depth), x) for b, x in zip(s.saved, cur, strict=True)
        ]
        stack_pos = put(s.stack_pos, s.depth, at)
        depth = depth + store.astype(depth.dtype)
        reload = _reload_slot(order, end, at, stack_pos, depth)
        return _Sweep(end, at, cur, saved, stack_pos, depth, cts, ct_body, reload)


def _reverse_from_every_state(
    sweep: _Reversal, n: Any, saved: list, cts: list, ct_body: list
) -> tuple:
    """The backward loop when state `i` is stored in slot `i` for every step:
    each iteration pulls the cotangents back through step `end - 1` from its
    stored state (a loop of a `vmap`ped batch that has reversed all its steps
    keeps its cotangents while the others go on)."""

    def one(s: tuple) -> tuple:
        end, cts, ct_body = s
        active = running(end > 0)
        before = jax.lax.max(end - 1, 0)
        _, pull = sweep.linearised(sweep.with_bufs([get(b, before) for b in saved]))
        new_cts, new_body = pull((cts, ct_body))
        keep = lambda new, old: [jnp.where(active, a, b) for a, b in zip(new, old)]  # noqa: E731
        return (
            end - active.astype(end.dtype),
            keep(new_cts, cts),
            keep(new_body, ct_body),
        )

    _, cts, ct_body = jax.lax.while_loop(
        lambda s: unvmap_any(s[0] > 0), one, (n, cts, ct_body)
    )
    return cts, ct_body


def backward(
    loop: Any, res: tuple, ct: list, b_pert: list, c_pert: list, nonzero: list
) -> tuple:
    """`(body cotangents, carry cotangents)`: the carry's as a list over all leaves,
    `None` where zero."""
    body_leaves, n, saved, pos, bufs = res
    live = nonzero_cotangents(
        loop.step(body_leaves), loop.leaves, c_pert, nonzero, loop.treedef
    )
    cts = [
        jnp.zeros(jnp.shape(x), jnp.result_type(x)) if is_zero(t) else t
        for x, t in pick(list(zip(loop.leaves, ct)), live)
    ]
    ct_body = [jnp.zeros_like(x) for x in pick(body_leaves, b_pert)]
    sweep = _Reversal(loop, body_leaves, b_pert, live, bufs)
    if loop.keeps_every_state:
        cts, ct_body = _reverse_from_every_state(sweep, n, saved, cts, ct_body)
        return ct_body, merge(live, cts, [None] * (len(live) - len(cts)))
    order, state = sweep.start(n, saved, pos, cts, ct_body)
    state = jax.lax.while_loop(
        lambda s: unvmap_any(s.end > 0), lambda s: sweep.one(s, order), state
    )
    cts = merge(live, state.cts, [None] * (len(live) - len(state.cts)))
    return state.ct_body, cts
