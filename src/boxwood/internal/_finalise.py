"""Finalisation: replacing custom primitives by what their implementation does.

Before handing a program to a consumer that knows only JAX's own primitives (an
ONNX exporter, say), `finalise_make_jaxpr(fn)(*args)` traces `fn` and rewrites
every primitive registered in `primitive_finalisations` (with
`register_impl_finalisation(prim)`, for one whose `impl` is written in JAX
operations) into the operations its rule runs, inside nested jaxprs too.

Transforming a function (`jax.grad`, `jax.vmap`, ...) after finalising it may give
wrong results: finalise last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax._src.custom_batching import custom_vmap_p
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Primitive

# primitive -> function called as `fn(*operands, **params)` in its place.
primitive_finalisations: dict = {}


def register_impl_finalisation(prim: Primitive) -> None:
    """Finalise `prim` by calling its implementation rule (`prim.impl`, looked up
    when the primitive is met, so a later `def_impl` is honoured)."""

    def call_impl(*args: Any, **params: Any) -> Any:
        return prim.impl(*args, **params)

    primitive_finalisations[prim] = call_impl


def _custom_vmap_call(*args: Any, call: Any, **params: Any) -> Any:
    # `custom_vmap` (behind `unvmap_any` and friends) outside `vmap`: its function.
    return finalise_eval_jaxpr(call.jaxpr, call.consts, *args)


primitive_finalisations[custom_vmap_p] = _custom_vmap_call


def _finalise_param(value: Any) -> Any:
    """A primitive's parameter with the jaxprs it holds (a cond's branches, a
    loop's body: directly or in a tuple) finalised."""
    if type(value) is tuple:
        return tuple(_finalise_param(v) for v in value)
    if isinstance(value, ClosedJaxpr):
        return finalise_jaxpr(value)
    if isinstance(value, Jaxpr) and not value.constvars:
        return finalise_jaxpr(ClosedJaxpr(value, [])).jaxpr
    return value


def _run_equation(eqn: Any, inputs: list) -> list:
    """The outputs of `eqn` on `inputs`, its primitive replaced by its finalisation
    (if registered) and the jaxprs in its parameters finalised."""
    params = {key: _finalise_param(v) for key, v in eqn.params.items()}
    bound = eqn.primitive.get_bind_params(params)
    subfuns, params = bound if isinstance(bound, tuple) else ([], bound)
    fn = primitive_finalisations.get(eqn.primitive, eqn.primitive.bind)
    out = fn(*subfuns, *inputs, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def finalise_eval_jaxpr(jaxpr: Jaxpr, consts: Any, *args: Any) -> list:
    """Evaluate `jaxpr` (as `jax.core.eval_jaxpr`), finalising each primitive."""
    known = dict(zip(jaxpr.constvars, consts))
    known.update(zip(jaxpr.invars, args))

    def value(atom: Any) -> Any:
        return atom.val if isinstance(atom, Literal) else known[atom]

    for eqn in jaxpr.eqns:
        outs = _run_equation(eqn, [value(a) for a in eqn.invars])
        known.update(zip(eqn.outvars, outs, strict=True))
    return [value(a) for a in jaxpr.outvars]


def finalise_jaxpr_as_fn(jaxpr: ClosedJaxpr) -> Callable:
    """As `jax.core.jaxpr_as_fn`, finalising."""

    def run(*args: Any) -> list:
        return finalise_eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *args)

    return run


def _input_structs(jaxpr: ClosedJaxpr) -> list:
    return [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.jaxpr.invars
    ]


def finalise_jaxpr(jaxpr: ClosedJaxpr) -> ClosedJaxpr:
    """`jaxpr` with its registered primitives finalised."""
    return jax.make_jaxpr(finalise_jaxpr_as_fn(jaxpr))(*_input_structs(jaxpr))


def finalise_fn(fn: Callable) -> Callable:
    """`fn`, finalised: traced, then evaluated with its registered primitives
    replaced (a transformation, like `jax.vmap`)."""

    def finalised(*args: Any) -> Any:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat_out = finalise_jaxpr_as_fn(closed)(*jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(out_shape), flat_out
        )

    return finalised


def finalise_make_jaxpr(fn: Callable, *, return_shape: bool = False) -> Callable:
    """As `jax.make_jaxpr`, with the registered primitives finalised."""

    def make(*args: Any) -> Any:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        finalised = finalise_jaxpr(closed)
        return (finalised, out_shape) if return_shape else finalised

    return make
