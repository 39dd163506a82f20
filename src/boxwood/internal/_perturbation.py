"""Which leaves of a loop's carry are differentiated, found by tracing one step.

- `perturbed_carry`: forward. A carry leaf is *perturbed* when its initial value is,
  or when some step writes into it a value depending on a perturbed leaf or on a
  perturbed array the body closes over. Found by iterating `filter_jvp` of one step
  (traced only, never run) to a fixed point. Leaves that are not perturbed are not
  differentiated at all: `nondifferentiable` inside the body does not fire for
  them.
- `nonzero_cotangents`: backward. A perturbed carry leaf has a nonzero cotangent
  when the final value of that leaf receives one, or when some step passes one back
  into it. Found from the dependencies of one step's tangent map (a jaxpr walked
  once; each equation's outputs depend on all of its inputs) to a fixed point.

When `typing.TESTING` is true (as Equinox's test configuration sets it), both
results are printed, as Equinox's checkpointed loop prints them: a tuple of the
loop's three internal entries (step, stored states, schedule: never differentiated)
and the carry, with a bool per leaf.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from .._transforms import filter_jvp


def _report(label: str, treedef: Any, flags: Sequence[bool], internal: bool) -> None:
    if getattr(typing, "TESTING", False):
        carry = jax.tree_util.tree_unflatten(treedef, list(flags))
        print(label, (internal, internal, internal, carry))


def inexact(x: Any) -> bool:
    """Floating or complex: an array, or a scalar as custom rules receive them."""
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _abstract(x: Any) -> Any:
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def _perturbed_outputs(step: Callable, *abstract: list) -> list:
    """Which outputs of one step have a tangent, traced (not run) at the
    abstract values `(body leaves, leaves, body tangents, tangents)`."""
    box: list = []

    def trace(b: list, c: list, bt: list, ct: list) -> int:
        _, t_out = filter_jvp(step, (b, c), (bt, ct))
        box.append([t is not None for t in t_out])
        return 0

    jax.eval_shape(trace, *abstract)
    return box[0]


def perturbed_carry(
    step: Callable,
    body_leaves: list,
    body_perturbed: list,
    leaves: list,
    perturbed: list,
) -> list:
    """A bool per carry leaf (see the module docstring). `step(body_leaves, leaves)`
    runs one step on flat lists. The caller reports the result
    (`report_perturbed`)."""
    perturbed = [bool(p) and inexact(x) for p, x in zip(perturbed, leaves)]
    body_leaves = [_abstract(x) for x in body_leaves]
    leaves = [_abstract(x) for x in leaves]
    body_t = [x if p else None for x, p in zip(body_leaves, body_perturbed)]
    while True:
        carry_t = [x if p else None for x, p in zip(leaves, perturbed)]
        out_perturbed = _perturbed_outputs(step, body_leaves, leaves, body_t, carry_t)
        new = [p or o for p, o in zip(perturbed, out_perturbed)]
        if new == perturbed:
            return perturbed
        perturbed = new


def report_perturbed(treedef: Any, flags: Sequence[bool]) -> None:
    """Print `perturbed_carry`'s result when `typing.TESTING` is set."""
    _report("perturb_val", treedef, flags, False)


def _dependencies(jaxpr: Any, n_in: int) -> list[int]:
    """For each output of `jaxpr`, the bit set of the (last `n_in`) inputs it
    depends on."""
    deps: dict = {}
    first = len(jaxpr.invars) - n_in
    for k, v in enumerate(jaxpr.invars[first:]):
        deps[v] = 1 << k

    def of(v: Any) -> int:
        return 0 if isinstance(v, Literal) else deps.get(v, 0)

    for eqn in jaxpr.eqns:
        mask = 0
        for v in eqn.invars:
            mask |= of(v)
        for v in eqn.outvars:
            deps[v] = mask
    return [of(v) for v in jaxpr.outvars]


def nonzero_cotangents(
    step: Callable, leaves: list, perturbed: list, nonzero: list, treedef: Any
) -> list:
    """A bool per carry leaf: whether its cotangent can be nonzero in the backward
    pass (see the module docstring). `step(leaves)` runs one step, the body fixed;
    only `perturbed` leaves are considered."""
    index = [j for j, p in enumerate(perturbed) if p]

    def tangent_map(primals: list, tangents: list) -> list:
        def part(sub: list) -> list:
            full = list(primals)
            for j, x in zip(index, sub):
                full[j] = x
            out = step(full)
            return [out[j] for j in index]

        return jax.jvp(part, ([primals[j] for j in index],), (tangents,))[1]

    abstract = [_abstract(x) for x in leaves]
    closed = jax.make_jaxpr(tangent_map)(abstract, [abstract[j] for j in index])
    deps = _dependencies(closed.jaxpr, len(index))
    live = {j for j in index if nonzero[j]}
    while True:
        grown = set(live)
        for out_pos, j in enumerate(index):
            if j in live:
                grown |= {index[k] for k in range(len(index)) if deps[out_pos] >> k & 1}
        if grown == live:
            break
        live = grown
    flags = [j in live for j in range(len(leaves))]
    _report("symbolic_zero_gradient", treedef, [not f for f in flags], True)
    return flags
