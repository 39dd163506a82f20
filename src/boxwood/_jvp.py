"""`filter_jvp` and `filter_vjp`: forward- and reverse-mode products on any pytree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.interpreters import ad

from ._filters import (
    combine,
    is_array,
    is_inexact_array,
    is_inexact_array_like,
    partition,
)
from ._partition import OutBox


def _is_none(x: Any) -> bool:
    return x is None


class TangentError(ValueError, TypeError):
    """Tangents that do not fit the primals. A `TypeError` as in Equinox (and
    JAX's `jax.jvp`), and a `ValueError` as boxwood first raised it."""


def _check_tangents(primals: Any, tangents: Any) -> None:
    p = jax.tree_util.tree_structure(primals, is_leaf=_is_none)
    t = jax.tree_util.tree_structure(tangents, is_leaf=_is_none)
    if p != t:
        raise TangentError(
            "`filter_jvp`: `tangents` must have the structure of `primals` (with "
            f"`None` for leaves that have no tangent); got {t} for primals of {p}."
        )
    for path, primal, tangent in _pairs(primals, tangents):
        if tangent is not None and not is_inexact_array_like(primal):
            where = jax.tree_util.keystr(path)
            raise TangentError(
                f"`filter_jvp`: `primals{where}` is not floating-point (an array or a "
                f"Python float), so its tangent `tangents{where}` must be `None`."
            )


def _pairs(primals: Any, tangents: Any) -> list:
    with_paths = jax.tree_util.tree_flatten_with_path(primals, is_leaf=_is_none)[0]
    t_leaves = jax.tree_util.tree_leaves(tangents, is_leaf=_is_none)
    return [(path, p, t) for (path, p), t in zip(with_paths, t_leaves)]


def filter_jvp(
    fn: Callable[..., Any], primals: Sequence, tangents: Sequence, **kwargs: Any
) -> tuple[Any, Any]:
    """`jax.jvp` for functions of arbitrary pytrees.

    **Arguments:**

    - `fn`: the function, called as `fn(*primals, **kwargs)`; its arguments and
      output may be any pytrees.
    - `primals`: the sequence of positional arguments.
    - `tangents`: the same structure as `primals`, with a floating-point array (or
      Python float) as the tangent of each primal to perturb and `None` everywhere
      else (`None` is required for non-floating-point leaves).
    - `**kwargs`: keyword arguments of `fn`; not differentiated.

    **Returns:**

    `(primals_out, tangents_out)`: `fn`'s output and its Jacobian-vector product,
    with `None` for every output leaf that does not depend on a perturbed input.

    >>> import boxwood, jax.numpy as jnp
    >>> f = lambda x, name: {"y": x ** 2, "name": name}
    >>> out, tangent = boxwood.filter_jvp(f, (jnp.array(3.0), "sq"), (jnp.array(1.0), None))
    >>> tangent
    {'name': None, 'y': Array(6., dtype=float32, weak_type=True)}
    """
    _check_tangents(primals, tangents)
    spec = jax.tree_util.tree_map(lambda t: t is not None, tangents, is_leaf=_is_none)
    dynamic, static = partition(primals, spec, is_leaf=_is_none)
    flat, treedef = jax.tree_util.tree_flatten(dynamic)
    flat_tangents = jax.tree_util.tree_leaves(tangents)
    box = OutBox()

    def inner(*leaves: Any) -> tuple:
        trace = leaves[0]._trace if leaves else None
        out = fn(
            *combine(jax.tree_util.tree_unflatten(treedef, leaves), static), **kwargs
        )

        def perturbed(x: Any) -> bool:
            return isinstance(x, ad.JVPTracer) and x._trace is trace

        moving, still = partition(out, perturbed)
        arrays, others = partition(still, is_array)
        box.put(others)
        return moving, arrays

    if not flat:  # nothing is perturbed: every output tangent is a symbolic zero
        out = fn(*primals, **kwargs)
        return out, jax.tree_util.tree_map(lambda _: None, out)
    (moving, arrays), (tangent_out, _) = jax.jvp(inner, flat, flat_tangents)
    return combine(moving, arrays, box.get()), tangent_out


def filter_vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple:
    """`jax.vjp` for functions of arbitrary pytrees.

    Floating-point arrays of `primals` are differentiated; every other leaf is
    passed through as it is.

    **Arguments:**

    - `fun`: the function, called as `fun(*primals)`; its output may be any pytree
      (or `(output, aux)` when `has_aux=True`).
    - `*primals`: its arguments.
    - `has_aux`: whether `fun` returns `(output, aux)`.

    **Returns:**

    `(output, vjp_fn)`, or `(output, vjp_fn, aux)` when `has_aux=True`. `vjp_fn`
    takes a cotangent with the structure of `output` (arrays for its floating-point
    arrays, `None` elsewhere) and returns a tuple with one cotangent per primal
    (`None` for its non-floating-point leaves).

    >>> import boxwood, jax.numpy as jnp
    >>> out, vjp_fn = boxwood.filter_vjp(lambda x, n: x * n, jnp.array(2.0), 3)
    >>> vjp_fn(jnp.array(1.0))
    (Array(3., dtype=float32, weak_type=True), None)
    """
    diff, nondiff = partition(primals, is_inexact_array)

    def inner(*d: Any) -> tuple:
        out = fun(*combine(d, nondiff))
        out, aux = out if has_aux else (out, None)
        out_diff, out_nondiff = partition(out, is_inexact_array)
        return out_diff, (out_nondiff, aux)

    out_diff, vjp_fn, (out_nondiff, aux) = jax.vjp(inner, *diff, has_aux=True)
    out = combine(out_diff, out_nondiff)
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)
