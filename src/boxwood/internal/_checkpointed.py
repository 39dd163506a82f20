"""The `"checkpointed"` kind of `while_loop`: reverse-mode differentiable with at
most `checkpoints` stored states, for loops whose length is known only at run time.

Forward pass: run the loop; before each step, `_online_schedule.next_slot` says in
which of the `checkpoints` slots to keep the carry (or not to keep it). Buffers
(`while_loop(buffers=...)`) are never stored: each of their elements is written at
most once, so the final buffers hold every value any step read, and recomputed
steps are given those.

Backward pass (`_reversal.py`): `_treeverse` reversal, as one `while` loop
(`_Reversal`). Take the
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
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from .._filters import combine, is_array, partition
from .._transforms import filter_closure_convert
from .._unvmap import unvmap_any
from . import _online_schedule
from ._leaf_lists import is_zero, merge, pick, put, running
from ._perturbation import (
    inexact,
    perturbed_carry,
    report_perturbed,
)
from ._reversal import backward


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
        return pick(leaves, [not b for b in self.buffer])

    def store(self, saved: list, slot: Any, leaves: list) -> list:
        """The checkpoint store `saved` with `leaves` (but their buffers) in `slot`."""
        return [put(b, slot, x) for b, x in zip(saved, self.kept(leaves), strict=True)]

    def gated_step(self, step: Callable, i: Any, leaves: list, go: Any) -> tuple:
        """Step `i` if `go`, else nothing: `(i, leaves)` after it. Buffers are
        written only where `go` (their writes are gated), the other leaves selected.
        Loops run while `unvmap_any(go)`: under `vmap` a loop whose length differs
        between batch elements then selects its small leaves itself, instead of
        `vmap` selecting every leaf of the carry (buffers, checkpoints) each step."""
        go = running(go)
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
        leaves, whose rules are `_forward` and `_reversal.backward`."""

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
            return out, (body_leaves, n, saved, pos, pick(out, self.buffer))

        def bwd(res: Any, ct: list) -> tuple:
            b_pert, c_pert = self.b_seen, self.c_seen
            nonzero = [p and not is_zero(t) for p, t in zip(c_pert, ct)]
            none_cond = [None] * len(self.cond_leaves)
            if res[3].shape[0] == 0 or not any(nonzero):  # no cotangent to pull back
                none_body = [None] * len(self.body_leaves)
                return none_body, none_cond, [None] * len(self.leaves)
            ct_body, ct_leaves = backward(self, res, ct, b_pert, c_pert, nonzero)
            ct_body = merge(b_pert, ct_body, [None] * b_pert.count(False))
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
            b_init = [not is_zero(t) for t in tb]
            c_init = [not is_zero(t) for t in tc]
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
            pick(out, self.buffer),
        )


def _forward(loop: _Loop, body_leaves: list, cond_leaves: list, leaves: list):
    """Run the loop, keeping states as `_online_schedule` says.

    Whether the next step runs and the slot its state goes into are computed at
    the end of the step before and carried, so each is computed once per step:
    computed where it is used, XLA would copy the schedule's arithmetic into the
    write of every stored leaf (a distinct kernel each, to compile)."""
    c = loop.c
    step, live = loop.step(body_leaves), loop.live(cond_leaves)
    leaves = [jnp.asarray(x) for x in leaves]
    # one slot more than asked for: the scratch slot `c`, written when a state is not
    # kept (cheaper than a conditional write)
    saved = [jnp.zeros((c + 1, *x.shape), x.dtype) for x in loop.kept(leaves)]
    pos = jnp.full((c + 1,), -1, jnp.int32)

    def where_next(i: Any, sched: dict, go: Any) -> tuple:
        """`(slot, sched)`: where state `i` is kept (`c`: nowhere) and the schedule
        after it, given whether step `i` runs (`go`)."""
        go = running(go)
        if loop.keeps_every_state:  # state `i` in slot `i`
            slot = jnp.where(go, i, c)
        else:
            slot, sched = _online_schedule.next_slot(c, i, sched, go, loop.max_steps)
        # State 0 is always written to its slot (slot 0), even by a loop that
        # takes no step: under `vmap` the backward pass may start from it.
        return jnp.where(i == 0, 0, slot), sched

    i = jnp.asarray(0, jnp.int32)
    go = live(i, leaves)
    # state 0: slot 0, and the schedule is unchanged by it (no run ends at step 0)
    slot, sched = jnp.asarray(0, jnp.int32), _online_schedule.initial_state(c)

    def one(s: tuple) -> tuple:
        i, leaves, saved, pos, sched, go, slot = s
        saved = loop.store(saved, slot, leaves)
        pos = put(pos, slot, jnp.where(running(go), i, -1))
        i, leaves = loop.gated_step(step, i, leaves, go)
        go = live(i, leaves)
        slot, sched = where_next(i, sched, go)
        return i, leaves, saved, pos, sched, go, slot

    def more(s: tuple) -> Any:
        return unvmap_any(s[5])

    start = (i, leaves, saved, pos, sched, go, slot)
    n, leaves, saved, pos, *_ = jax.lax.while_loop(more, one, start)
    return n, leaves, saved, pos


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
