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

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax._src.custom_batching import custom_vmap_p
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Primitive

# primitive -> function called as `fn(*operands, **params)` in its place.
primitive_finalisations: dict = {}


def _call_impl(prim: Primitive, *args: Any, **params: Any) -> Any:
    return prim.impl(*args, **params)


def register_impl_finalisation(prim: Primitive) -> None:
    """Finalise `prim` by calling its implementation rule (`prim.impl`)."""
    primitive_finalisations[prim] = functools.partial(_call_impl, prim)


def _custom_vmap_call(*args: Any, call: Any, **params: Any) -> Any:
    # `custom_vmap` (behind `unvmap_any` and friends) outside `vmap`: its function.
    return finalise_eval_jaxpr(call.jaxpr, call.consts, *args)


primitive_finalisations[custom_vmap_p] = _custom_vmap_call


def _finalise_value(value: Any) -> Any:
    if isinstance(value, ClosedJaxpr):
        return finalise_jaxpr(value)
    if isinstance(value, Jaxpr) and not value.constvars:
        return finalise_jaxpr(ClosedJaxpr(value, [])).jaxpr
    return value


def _finalise_params(params: dict) -> dict:
    out = {}
    for key, value in params.items():
        if type(value) is tuple:
            out[key] = tuple(_finalise_value(v) for v in value)
        else:
            out[key] = _finalise_value(value)
    return out


def finalise_eval_jaxpr(jaxpr: Jaxpr, consts: Any, *args: Any) -> list:
    """Evaluate `jaxpr` (as `jax.core.eval_jaxpr`), finalising each primitive."""
    env: dict = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    for var, value in (*zip(jaxpr.constvars, consts), *zip(jaxpr.invars, args)):
        env[var] = value
    for eqn in jaxpr.eqns:
        bound = eqn.primitive.get_bind_params(_finalise_params(eqn.params))
        subfuns, params = bound if isinstance(bound, tuple) else ([], bound)
        call = primitive_finalisations.get(eqn.primitive, eqn.primitive.bind)
        out = call(*subfuns, *map(read, eqn.invars), **params)
        outs = out if eqn.primitive.multiple_results else [out]
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def finalise_jaxpr_as_fn(jaxpr: ClosedJaxpr) -> Callable:
    """As `jax.core.jaxpr_as_fn`, finalising."""
    return functools.partial(finalise_eval_jaxpr, jaxpr.jaxpr, jaxpr.consts)


def finalise_jaxpr(jaxpr: ClosedJaxpr) -> ClosedJaxpr:
    """`jaxpr` with its registered primitives finalised."""
    structs = [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.jaxpr.invars
    ]
    return jax.make_jaxpr(finalise_jaxpr_as_fn(jaxpr))(*structs)


def finalise_fn(fn: Callable) -> Callable:
    """`fn`, finalised: traced, then evaluated with its registered primitives
    replaced (a transformation, like `jax.vmap`)."""

    def finalised(*args: Any) -> Any:
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = finalise_eval_jaxpr(
            closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args)
        )
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), out)

    return finalised


def finalise_make_jaxpr(fn: Callable, *, return_shape: bool = False) -> Callable:
    """As `jax.make_jaxpr`, with the registered primitives finalised."""

    def make(*args: Any) -> Any:
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        closed = finalise_jaxpr(closed)
        return (closed, shape) if return_shape else closed

    return make
