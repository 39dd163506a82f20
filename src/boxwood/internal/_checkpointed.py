"""The `"checkpointed"` kind of `while_loop`: reverse-mode differentiable with at
most `checkpoints` stored states, for loops whose length is known only at run time.

Forward pass: run the loop; before each step, `_online_schedule.next_slot` says in
which of the `checkpoints` slots to keep the carry (or not to keep it). Buffers
(`while_loop(buffers=...)`) are never stored: each of their elements is written at
most once, so the final buffers hold every value any step read, and recomputed
steps are given those.

Backward pass: `_treeverse` reversal, as one `while` loop (`_Reversal`). Take the
latest stored state `p` and the number `L` of steps from it still to reverse. If
`L == 1`, pull the cotangent back through step `p` and free its slot. Otherwise,
with free slots, advance `_treeverse` `Planner.advance_by(L, s)` steps from `p` and
store the state reached; without, advance from `p` up to the last step and pull
the cotangent back through it. Each iteration of the loop runs the step once,
linearised (`jax.vjp`): advancing keeps its output, reversing applies its
transpose (under a `lax.cond`) and reloads the latest stored state. So the step is
in the program once, and neither the recomputation nor the plan is a loop of its
own: the gradient of a loop holds two `while` loops (forward and backward), and a
loop nested in the body adds its own two. Stored states are kept as a stack:
`order[:depth]` are the slots in use, in step order, and `order[depth:]` the free
ones.

A loop with a slot for every state it can reach (`checkpoints >= max_steps`, as
diffrax's Runge-Kutta stage loops) keeps state `i` in slot `i` with no schedule,
and its backward loop pulls back through one step per iteration from its stored
state, with no conditional; the gradients, the memory and the steps run are
those of the general path, whose plan would do the same at run time.

Without differentiation the loop is a plain `lax.while_loop` and stores nothing.
The body is closure-converted first, so arrays it closes over (model parameters)
get cotangents too. The loop is a `custom_vjp` (`_Loop.__call__`): only the carry
leaves `_perturbation` finds perturbed are differentiated, and only those with
nonzero cotangents are carried backwards; closed-over arrays are differentiated
when JAX reports them perturbed (a `nondifferentiable` value closed over is left
alone, as in Equinox). The backward rule differentiates the union of what every
trace of the forward rule found perturbed (`_Loop.note_perturbed`: JAX hands it the
residuals of the last trace, which for a loop nested in another loop's body is not
the trace of the call being differentiated). A `custom_vjp` gives every
floating-point output a tangent, so the outputs pass through a `custom_jvp`
identity (`_Loop.stop_unperturbed`) that gives those depending on no perturbed
input a symbolic zero, as Equinox's loop does (`nondifferentiable` accepts them).
Everything is on flat lists of leaves (`_Loop` knows the pytree structures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import custom_batching
from jax.custom_derivatives import SymbolicZero

from .._closure_convert import filter_closure_convert
from .._filters import combine, is_array, partition
from .._unvmap import unvmap_any
from . import _online_schedule, _treeverse
from ._perturbation import (
    inexact,
    nonzero_cotangents,
    perturbed_carry,
    report_perturbed,
)

_MAX_STEPS = int(jnp.iinfo(jnp.int32).max)  # steps are counted in int32


def _is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero)


def _pick(xs: list, flags: list) -> list:
    return [x for x, f in zip(xs, flags) if f]


def _get(x: Any, i: Any) -> Any:
    """`x[i]` for an index known to be in bounds (no wrapping of negative ones)."""
    start = (i,) + (0,) * (x.ndim - 1)
    row = jax.lax.dynamic_slice(
        x, start, (1, *x.shape[1:]), allow_negative_indices=False
    )
    return jax.lax.squeeze(row, (0,))


def _put(x: Any, i: Any, value: Any) -> Any:
    """`x.at[i].set(value)` for an index known to be in bounds."""
    start = (i,) + (0,) * (x.ndim - 1)
    row = jax.lax.expand_dims(jax.lax.convert_element_type(value, x.dtype), (0,))
    return jax.lax.dynamic_update_slice(x, row, start, allow_negative_indices=False)


def _merge(flags: list, chosen: list, others: list) -> list:
    """Interleave: `chosen` where `flags` is true, `others` elsewhere, in order."""
    chosen_it, others_it = iter(chosen), iter(others)
    return [next(chosen_it) if f else next(others_it) for f in flags]


@custom_batching.custom_vmap
def _running(go: Any) -> Any:
    """Whether a step that the loop runs is live: `go` itself for the batch
    elements of a `vmap`, but `True` without one, since a loop that is not batched
    runs its body only while `go` holds. So the selects and gated buffer writes of
    a step fold away where nothing is batched."""
    return jnp.ones_like(go)


@_running.def_vmap
def _running_batched(axis_size: int, in_batched: list, go: Any) -> tuple:
    del axis_size
    if in_batched[0]:
        return go, True
    return _running(go), False  # an enclosing `vmap` may batch it


class _Loop:
    """One checkpointed loop: the structures of its body, condition and carry."""

    def __init__(
        self, body: Any, cond: Any, arrays: Any, is_buffer: Any, max_steps: Any, c: int
    ) -> None:
        body_dyn, self.body_static = partition(body, is_array)
        cond_dyn, self.cond_static = partition(cond, is_array)
        self.body_leaves, self.body_def = jax.tree_util.tree_flatten(body_dyn)
        self.cond_leaves, self.cond_def = jax.tree_util.tree_flatten(cond_dyn)
        self.leaves, self.treedef = jax.tree_util.tree_flatten(arrays)
        self.buffer = [bool(f) for f in jax.tree_util.tree_leaves(is_buffer)]
        assert len(self.buffer) == len(self.leaves)
        self.max_steps, self.c = max_steps, c
        # what `bwd` differentiates (see `note_perturbed`)
        self.b_seen = [False] * len(self.body_leaves)
        self.c_seen = [False] * len(self.leaves)
        self.analysed: dict = {}  # see `perturbed`

    def step(self, body_leaves: list) -> Callable:
        """One step of the loop on the carry's flat leaves."""
        body = combine(
            jax.tree_util.tree_unflatten(self.body_def, body_leaves), self.body_static
        )

        def one(leaves: list, live: Any = True) -> list:
            """`live`: whether the step is live (see `gated_step`)."""
            tree = jax.tree_util.tree_unflatten(self.treedef, leaves)
            out = body(tree, jnp.asarray(live))
            return [jnp.asarray(x) for x in jax.tree_util.tree_leaves(out)]

        return one

    def live(self, cond_leaves: list) -> Callable:
        """Whether step `i` runs, given the carry's flat leaves."""
        cond = combine(
            jax.tree_util.tree_unflatten(self.cond_def, cond_leaves), self.cond_static
        )

        def keep_going(i: Any, leaves: list) -> Any:
            go = cond(jax.tree_util.tree_unflatten(self.treedef, leaves))
            return go if self.max_steps is None else go & (i < self.max_steps)

        return keep_going

    @property
    def keeps_every_state(self) -> bool:
        """Whether there is a slot for every state the loop can reach (at most
        `max_steps` steps): state `i` is then kept in slot `i`, and the backward
        pass reverses the steps one by one from their stored states, with no
        schedule and no recomputation (`_reverse_from_every_state`)."""
        return self.max_steps is not None and self.c >= self.max_steps

    def kept(self, leaves: list) -> list:
        """The leaves that checkpoints store (not the buffers)."""
        return _pick(leaves, [not b for b in self.buffer])

    def store(self, saved: list, slot: Any, leaves: list) -> list:
        """The checkpoint store `saved` with `leaves` (but their buffers) in `slot`."""
        return [_put(b, slot, x) for b, x in zip(saved, self.kept(leaves), strict=True)]

    def gated_step(self, step: Callable, i: Any, leaves: list, go: Any) -> tuple:
        """Step `i` if `go`, else nothing: `(i, leaves)` after it. Buffers are
        written only where `go` (their writes are gated), the other leaves selected.
        Loops run while `unvmap_any(go)`: under `vmap` a loop whose length differs
        between batch elements then selects its small leaves itself, instead of
        `vmap` selecting every leaf of the carry (buffers, checkpoints) each step."""
        go = _running(go)
        new = step(leaves, go)
        leaves = [
            n if b else jnp.where(go, n, x) for n, x, b in zip(new, leaves, self.buffer)
        ]
        return i + go.astype(i.dtype), leaves

    def plain(self, body_leaves: list, cond_leaves: list, leaves: list) -> list:
        """The loop without differentiation. Whether the next step runs is
        computed once per step, at the end of the one before, and carried."""
        step, live = self.step(body_leaves), self.live(cond_leaves)

        def one(s: tuple) -> tuple:
            i, leaves = self.gated_step(step, s[0], s[1], s[2])
            return i, leaves, live(i, leaves)

        leaves = [jnp.asarray(x) for x in leaves]
        start = (jnp.asarray(0), leaves, live(jnp.asarray(0), leaves))
        return jax.lax.while_loop(lambda s: unvmap_any(s[2]), one, start)[1]

    def __call__(self) -> Any:
        """Run the loop: a `custom_vjp` of the body's, condition's and carry's
        leaves, whose rules are `_forward` and `_backward`."""

        @jax.custom_vjp
        def run(body_leaves: list, cond_leaves: list, leaves: list) -> list:
            return self.plain(body_leaves, cond_leaves, leaves)

        def fwd(body_leaves: list, cond_leaves: list, leaves: list) -> tuple:
            b_pert = [p.perturbed for p in body_leaves]
            c_init = [p.perturbed for p in leaves]
            body_leaves, cond_leaves, leaves = jax.tree_util.tree_map(
                lambda p: jnp.asarray(p.value), (body_leaves, cond_leaves, leaves)
            )
            b_pert, c_pert = self.perturbed(body_leaves, b_pert, leaves, c_init)
            report_perturbed(self.treedef, c_pert)
            self.note_perturbed(b_pert, c_pert)
            if not any(c_pert):  # nothing to differentiate: store nothing
                out = self.plain(body_leaves, cond_leaves, leaves)
                return out, self.no_residuals(body_leaves, out)
            n, out, saved, pos = _forward(self, body_leaves, cond_leaves, leaves)
            return out, (body_leaves, n, saved, pos, _pick(out, self.buffer))

        def bwd(res: Any, ct: list) -> tuple:
            b_pert, c_pert = self.b_seen, self.c_seen
            nonzero = [p and not _is_zero(t) for p, t in zip(c_pert, ct)]
            none_cond = [None] * len(self.cond_leaves)
            if res[3].shape[0] == 0 or not any(nonzero):  # no cotangent to pull back
                none_body = [None] * len(self.body_leaves)
                return none_body, none_cond, [None] * len(self.leaves)
            ct_body, ct_leaves = _backward(self, res, ct, b_pert, c_pert, nonzero)
            ct_body = _merge(b_pert, ct_body, [None] * b_pert.count(False))
            return ct_body, none_cond, ct_leaves

        run.defvjp(fwd, bwd, symbolic_zeros=True)
        out = run(self.body_leaves, self.cond_leaves, self.leaves)
        out = self.stop_unperturbed(self.body_leaves, self.leaves, out)
        return jax.tree_util.tree_unflatten(self.treedef, out)

    def stop_unperturbed(self, body_leaves: list, leaves: list, out: list) -> list:
        """`out`, whose leaves that depend on no perturbed input (of `body_leaves`
        and `leaves`, the loop's inputs) have no tangent: a `custom_jvp` identity
        whose rule keeps the tangents of the leaves `perturbed_carry` finds
        perturbed and gives the others symbolic zeros (a `custom_vjp` gives every
        floating-point output a tangent)."""

        @jax.custom_jvp
        def identity(body_leaves: list, leaves: list, out: list) -> list:
            return out

        def rule(primals: tuple, tangents: tuple) -> tuple:
            body_leaves, leaves, out = primals
            tb, tc, to = tangents
            b_init = [not _is_zero(t) for t in tb]
            c_init = [not _is_zero(t) for t in tc]
            _, c_pert = self.perturbed(body_leaves, b_init, leaves, c_init)
            keep = [
                t if p else SymbolicZero(jax.typeof(x).to_tangent_aval())
                for x, t, p in zip(out, to, c_pert)
            ]
            return out, keep

        identity.defjvp(rule, symbolic_zeros=True)
        return identity(body_leaves, leaves, out)

    def perturbed(
        self, body_leaves: list, b_init: list, leaves: list, c_init: list
    ) -> tuple[list, list]:
        """`(perturbed body leaves, perturbed carry leaves)` given which inputs
        have tangents (`b_init`, `c_init`; only floating-point ones count): the
        carry's from `perturbed_carry`, traced once per pattern and shapes (the
        forward rule and `stop_unperturbed` both ask)."""
        b_pert = [bool(p) and inexact(x) for p, x in zip(b_init, body_leaves)]
        c_init = [bool(p) and inexact(x) for p, x in zip(c_init, leaves)]
        shapes = tuple(
            (jnp.shape(x), jnp.result_type(x)) for x in (*body_leaves, *leaves)
        )
        key = (tuple(b_pert), tuple(c_init), shapes)
        if key not in self.analysed:
            self.analysed[key] = perturbed_carry(
                lambda b, c: self.step(b)(c),
                body_leaves,
                b_pert,
                leaves,
                c_init,
            )
        return b_pert, self.analysed[key]

    def note_perturbed(self, b_pert: list, c_pert: list) -> None:
        """Add one forward rule's analysis to what `bwd` differentiates.

        JAX traces the forward rule once per pattern of perturbed inputs (memoised,
        and shared by every evaluation of a jaxpr holding this loop, as a loop
        nested in another loop's body is), but hands `bwd` the residuals with the
        tree structure of the *last* trace. So the residuals' structure is the
        same for every pattern, and `bwd` differentiates the union of the leaves
        found perturbed by every trace so far (a superset of its own call's; the
        cotangents of unperturbed inputs are dropped by JAX). A leaf no trace
        found perturbed (a `nondifferentiable` value closed over) is never
        differentiated."""
        self.b_seen = [a or b for a, b in zip(self.b_seen, b_pert)]
        self.c_seen = [a or b for a, b in zip(self.c_seen, c_pert)]

    def no_residuals(self, body_leaves: list, out: list) -> tuple:
        """Residuals of the structure `_forward`'s have, holding no checkpoint
        (`pos` of length 0 marks them)."""
        saved = [
            jnp.zeros((0, *jnp.shape(x)), jnp.result_type(x)) for x in self.kept(out)
        ]
        pos = jnp.zeros((0,), jnp.int32)
        return (
            body_leaves,
            jnp.asarray(0, jnp.int32),
            saved,
            pos,
            _pick(out, self.buffer),
        )


def _forward(loop: _Loop, body_leaves: list, cond_leaves: list, leaves: list):
    """Run the loop, keeping states as `_online_schedule` says."""
    c = loop.c
    step, live = loop.step(body_leaves), loop.live(cond_leaves)
    leaves = [jnp.asarray(x) for x in leaves]
    # one slot more than asked for: the scratch slot `c`, written when a state is not
    # kept (cheaper than a conditional write)
    saved = [jnp.zeros((c + 1, *x.shape), x.dtype) for x in loop.kept(leaves)]
    pos = jnp.full((c + 1,), -1, jnp.int32)
    i = jnp.asarray(0, jnp.int32)
    start = (i, leaves, saved, pos, _online_schedule.initial_state(c), live(i, leaves))

    def one(s: tuple) -> tuple:
        i, leaves, saved, pos, sched, go = s
        go = _running(go)
        if loop.keeps_every_state:  # state `i` in slot `i`
            slot = jnp.where(go, i, c)
        else:
            slot, sched = _online_schedule.next_slot(c, i, sched, go, loop.max_steps)
        # State 0 is always written to its slot (slot 0), even by a loop that
        # takes no step: under `vmap` the backward pass may start from it.
        slot = jnp.where(i == 0, 0, slot)
        saved = loop.store(saved, slot, leaves)
        pos = _put(pos, slot, jnp.where(go, i, -1))
        i, leaves = loop.gated_step(step, i, leaves, go)
        return i, leaves, saved, pos, sched, live(i, leaves)

    def more(s: tuple) -> Any:
        return unvmap_any(s[-1])

    n, leaves, saved, pos, _, _ = jax.lax.while_loop(more, one, start)
    return n, leaves, saved, pos


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
    loop: _Loop, body_leaves: list, b_pert: list, live: list, leaves: list
) -> tuple:
    """`(out, pull)`: one step from `leaves` (all its output leaves), and the
    function pulling `(cts, ct_body)` back through it: the cotangents of the `live`
    carry leaves, and (added to `ct_body`) of the perturbed body leaves."""

    def one_step(pb: list, lv: list) -> tuple:
        full_body = _merge(b_pert, pb, _pick(body_leaves, [not p for p in b_pert]))
        full = _merge(live, lv, _pick(leaves, [not x for x in live]))
        out = loop.step(full_body)(full)
        return _pick(out, live), out

    pb, lv = _pick(body_leaves, b_pert), _pick(leaves, live)
    _, vjp_fn, out = jax.vjp(one_step, pb, lv, has_aux=True)

    def pull(cts_and_body: tuple) -> tuple:
        cts, ct_body = cts_and_body
        d_body, d_leaves = vjp_fn(cts)
        return list(d_leaves), [a + b for a, b in zip(ct_body, d_body)]

    return out, pull


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


class _Reversal:
    """The backward pass as one `while` loop. Each iteration runs the step from
    `cur`, linearised. While `cur` is before step `end - 1`, it moves `cur` on to
    the state reached (and stores it where `_treeverse` says); at step `end - 1`
    it pulls the cotangents back through the step instead (the transpose alone is
    under a `lax.cond`), and continues from the latest stored state, freeing its
    slot when it held the state just used. The step is in the program once."""

    def __init__(
        self, loop: _Loop, body_leaves: list, b_pert: list, live: list, bufs: list
    ) -> None:
        self.loop, self.bufs = loop, bufs
        self.linearised = lambda leaves: _linearised_step(
            loop, body_leaves, b_pert, live, leaves
        )
        longest = _MAX_STEPS if loop.max_steps is None else loop.max_steps
        self.planner = _treeverse.Planner(loop.c, longest)

    def with_bufs(self, kept: list) -> list:
        """All the carry's leaves: `kept` and the final buffers. Steps read the
        final buffers, and their writes to them are dropped: each element is
        written once, so the buffers hold those values already."""
        return _merge(self.loop.buffer, self.bufs, kept)

    def start(self, n: Any, saved: list, pos: Any, cts: list, ct_body: list) -> tuple:
        order, stack_pos, depth = _stack(pos, self.loop.c)
        top = jax.lax.max(depth - 1, 0)
        at = jax.lax.select(depth > 0, _get(stack_pos, top), 0)
        cur = [_get(b, _get(order, top)) for b in saved]
        return order, _Sweep(n, at, cur, saved, stack_pos, depth, cts, ct_body)

    def target(self, s: _Sweep) -> Any:
        """The step whose state is stored next on the way to `end - 1` (-1: none)."""
        top = _get(s.stack_pos, jax.lax.max(s.depth - 1, 0))
        length, free = s.end - top, self.loop.c - s.depth + 1
        m = self.planner.advance_by(length, free)
        return jax.lax.select((length >= 2) & (free >= 2), top + m, -1)

    def one(self, s: _Sweep, order: Any) -> _Sweep:
        # Under `vmap` the loop runs while any batch element has steps left; the
        # others keep `cur`, so that no step sees a state the loop never reached.
        active, back = s.end > 0, s.at == s.end - 1
        target = self.target(s)
        out, pull = self.linearised(self.with_bufs(s.cur))
        cts, ct_body = jax.lax.cond(back, pull, lambda c: c, (s.cts, s.ct_body))
        end = s.end - back.astype(s.end.dtype)
        # reversed: free the top slot if it held the state just used, reload
        done = back & (_get(s.stack_pos, jax.lax.max(s.depth - 1, 0)) == end)
        depth = s.depth - done.astype(s.depth.dtype)
        top = jax.lax.max(depth - 1, 0)
        stored = [_get(b, _get(order, top)) for b in s.saved]
        cur = [
            jax.lax.select(back, x, jax.lax.select(active, y, z))
            for x, y, z in zip(stored, self.loop.kept(out), s.cur, strict=True)
        ]
        at = jax.lax.select(
            back, _get(s.stack_pos, top), s.at + active.astype(s.at.dtype)
        )
        store = active & ~back & (at == target)
        # `cur` is written to the first free slot (the scratch slot when none is
        # free) whether or not it is kept there: the index depends on `depth`
        # alone, and `store` only decides whether the stack grows to include it.
        saved = [
            _put(b, _get(order, s.depth), x) for b, x in zip(s.saved, cur, strict=True)
        ]
        stack_pos = _put(s.stack_pos, s.depth, at)
        depth = depth + store.astype(depth.dtype)
        return _Sweep(end, at, cur, saved, stack_pos, depth, cts, ct_body)


def _reverse_from_every_state(
    sweep: _Reversal, n: Any, saved: list, cts: list, ct_body: list
) -> tuple:
    """The backward loop when state `i` is stored in slot `i` for every step:
    each iteration pulls the cotangents back through step `end - 1` from its
    stored state (a loop of a `vmap`ped batch that has reversed all its steps
    keeps its cotangents while the others go on)."""

    def one(s: tuple) -> tuple:
        end, cts, ct_body = s
        active = end > 0
        before = jax.lax.max(end - 1, 0)
        _, pull = sweep.linearised(sweep.with_bufs([_get(b, before) for b in saved]))
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


def _backward(
    loop: _Loop, res: tuple, ct: list, b_pert: list, c_pert: list, nonzero: list
) -> tuple:
    """`(body cotangents, carry cotangents)`: the carry's as a list over all leaves,
    `None` where zero."""
    body_leaves, n, saved, pos, bufs = res
    live = nonzero_cotangents(
        loop.step(body_leaves), loop.leaves, c_pert, nonzero, loop.treedef
    )
    cts = [
        jnp.zeros(jnp.shape(x), jnp.result_type(x)) if _is_zero(t) else t
        for x, t in _pick(list(zip(loop.leaves, ct)), live)
    ]
    ct_body = [jnp.zeros_like(x) for x in _pick(body_leaves, b_pert)]
    sweep = _Reversal(loop, body_leaves, b_pert, live, bufs)
    if loop.keeps_every_state:
        cts, ct_body = _reverse_from_every_state(sweep, n, saved, cts, ct_body)
        return ct_body, _merge(live, cts, [None] * (len(live) - len(cts)))
    order, state = sweep.start(n, saved, pos, cts, ct_body)
    state = jax.lax.while_loop(
        lambda s: unvmap_any(s.end > 0), lambda s: sweep.one(s, order), state
    )
    cts = _merge(live, state.cts, [None] * (len(live) - len(state.cts)))
    return state.ct_body, cts


def checkpointed_while(
    cond: Callable,
    body: Callable,
    arrays: Any,
    max_steps: Any,
    checkpoints: int,
    is_buffer: Any,
) -> Any:
    """Run the loop on the pytree of arrays `arrays` (see the module docstring);
    `is_buffer` marks (with the structure of `arrays`) the leaves that are buffers."""
    body = filter_closure_convert(body, arrays, jnp.asarray(True))
    cond = filter_closure_convert(cond, arrays)
    return _Loop(body, cond, arrays, is_buffer, max_steps, checkpoints)()
