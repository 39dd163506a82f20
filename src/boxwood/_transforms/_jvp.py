"""`filter_jvp`: forward-mode products on any pytree (`_vjp.py` holds the
reverse mode)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.interpreters import ad

from .._filters import is_array, is_inexact_array_like
from .._tracebacks import hiding_own_frames
from ._split import OutBox


def _is_none(x: Any) -> bool:
    return x is None


class TangentError(ValueError, TypeError):
    """Tangents that do not fit the primals. A `TypeError` as in Equinox (and
    JAX's `jax.jvp`), and a `ValueError` as boxwood first raised it."""


def _perturbed_leaves(primals: Any, tangents: Any) -> tuple[list, Any, dict]:
    """`(leaves, treedef, tangent_at)`: the primals' leaves (`None` counts as one)
    and the tangent of each perturbed leaf, by position; checked against the
    primals."""
    paired, treedef = jax.tree_util.tree_flatten_with_path(primals, is_leaf=_is_none)
    if jax.tree_util.tree_structure(tangents, is_leaf=_is_none) != treedef:
        got = jax.tree_util.tree_structure(tangents, is_leaf=_is_none)
        raise TangentError(
            "`filter_jvp`: `tangents` must have the structure of `primals` (with "
            f"`None` for leaves that have no tangent); got {got} for primals of "
            f"{treedef}."
        )
    tangent_at = {}
    for i, ((path, primal), tangent) in enumerate(
        zip(paired, treedef.flatten_up_to(tangents))
    ):
        if tangent is None:
            continue
        if not is_inexact_array_like(primal):
            where = jax.tree_util.keystr(path)
            raise TangentError(
                f"`filter_jvp`: `primals{where}` is not floating-point (an array or a "
                f"Python float), so its tangent `tangents{where}` must be `None`."
            )
        tangent_at[i] = tangent
    return [leaf for _, leaf in paired], treedef, tangent_at


_MOVING, _ARRAY, _OTHER = "moving", "array", "other"


def _sort_output(out: Any, trace: Any) -> tuple[list, Any, list]:
    """`(leaves, treedef, kinds)`: each output leaf is `_MOVING` (it carries a
    tangent of this `jax.jvp`), an `_ARRAY` without one, or `_OTHER`."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    kinds = [
        _MOVING
        if isinstance(x, ad.JVPTracer) and x._trace is trace
        else (_ARRAY if is_array(x) else _OTHER)
        for x in leaves
    ]
    return leaves, treedef, kinds


@hiding_own_frames
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
    leaves, treedef, tangent_at = _perturbed_leaves(primals, tangents)
    if not tangent_at:  # nothing is perturbed: every output tangent is a zero
        out = fn(*primals, **kwargs)
        return out, jax.tree_util.tree_map(lambda _: None, out)
    order = sorted(tangent_at)
    box = OutBox()

    def pushed(*values: Any) -> tuple[list, list]:
        inputs = list(leaves)
        for i, value in zip(order, values):
            inputs[i] = value
        out = fn(*treedef.unflatten(inputs), **kwargs)
        out_leaves, out_def, kinds = _sort_output(out, values[0]._trace)
        box.put((out_def, kinds, out_leaves))
        by_kind = ([], [])
        for x, kind in zip(out_leaves, kinds):
            if kind != _OTHER:
                by_kind[kind == _ARRAY].append(x)
        return by_kind

    primal_lists, tangent_lists = jax.jvp(
        pushed, [leaves[i] for i in order], [tangent_at[i] for i in order]
    )
    out_def, kinds, traced_leaves = box.get()
    return _assemble(out_def, kinds, traced_leaves, primal_lists, tangent_lists[0])


def _assemble(
    out_def: Any, kinds: list, traced: list, primals: tuple, tangents: list
) -> tuple[Any, Any]:
    """The output and its tangent tree (`None` where nothing moves), from the
    leaves `jax.jvp` returned (`primals`: moving, then other arrays) and the
    non-array leaves kept from the trace."""
    moving, arrays, moving_tangents = iter(primals[0]), iter(primals[1]), iter(tangents)
    out, tangent = [], []
    for kind, x in zip(kinds, traced):
        if kind == _MOVING:
            out.append(next(moving))
            tangent.append(next(moving_tangents))
        else:
            out.append(next(arrays) if kind == _ARRAY else x)
            tangent.append(None)
    return out_def.unflatten(out), out_def.unflatten(tangent)
