"""`backward_nan`: print cotangents, and stop on a NaN one."""

from __future__ import annotations

import functools
from typing import Any, cast

import jax
import jax.numpy as jnp

from .._errors import error_if
from .._filters import combine, is_array, partition
from .._pretty import tree_pformat


def _print(prefix: str, treedef: Any, arrays: list, cts: list) -> None:
    """Print the watched values, in the structure of `x`, with their values."""
    x = tree_pformat(jax.tree_util.tree_unflatten(treedef, arrays), short_arrays=False)
    ct = tree_pformat(jax.tree_util.tree_unflatten(treedef, cts), short_arrays=False)
    print(f"{prefix}   primals={x}\ncotangents={ct}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _watch(arrays: list, name: str | None, terminate: bool, treedef: Any) -> list:
    return arrays


def _watch_fwd(arrays: list, name: str | None, terminate: bool, treedef: Any):
    return arrays, arrays


def _watch_bwd(
    name: str | None, terminate: bool, treedef: Any, arrays: list, cts: list
) -> tuple:
    prefix = "" if name is None else f"{name}:\n"
    jax.debug.callback(
        functools.partial(_print, prefix, treedef), arrays, cts, ordered=True
    )
    if terminate:
        floats = [c for c in cts if jnp.issubdtype(c.dtype, jnp.inexact)]
        if floats:
            nan = jnp.any(jnp.stack([jnp.isnan(c).any() for c in floats]))
            where = "" if name is None else f" in `{name}`"
            cts = error_if(cts, nan, f"NaN cotangent{where} (`backward_nan`).")
    return (cts,)


_watch.defvjp(_watch_fwd, _watch_bwd)


def backward_nan(x: Any, name: str | None = None, terminate: bool = True) -> Any:
    """Return `x` unchanged; on the backward pass print its primal and cotangent,
    and (if `terminate`) raise if the cotangent holds a NaN.

    **Arguments:**

    - `x`: any pytree; its floating-point arrays are watched.
    - `name`: a label printed with the values.
    - `terminate`: raise through [`boxwood.error_if`][] on a NaN cotangent (so
      `BOXWOOD_ON_ERROR=breakpoint` opens a debugger there instead).

    **Returns:**

    `x`.
    """
    arrays, others = partition(
        x, lambda a: is_array(a) and jnp.issubdtype(a.dtype, jnp.inexact)
    )
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    leaves = cast(list, _watch(leaves, name, terminate, treedef))
    return combine(jax.tree_util.tree_unflatten(treedef, leaves), others)


debug_backward_nan = backward_nan  # its name in `boxwood.internal` (as in Equinox)
