"""`backward_nan`: print cotangents, and stop on a NaN one."""

from __future__ import annotations

import functools
from typing import Any, cast

import jax
import jax.numpy as jnp

from .._errors import error_if
from .._filters import is_inexact_array
from .._pretty import tree_pformat
from .._transforms import Slots


class _Watch:
    """What one `backward_nan` call reports on the backward pass. Compared by
    identity: it is a non-differentiable argument of the custom VJP."""

    __slots__ = ("name", "terminate", "treedef", "where")

    def __init__(self, name: str | None, terminate: bool, watched: Slots) -> None:
        self.name, self.terminate = name, terminate
        # the structure of `x`, with `None` at the leaves that are not watched
        self.treedef, self.where = watched.treedef, watched.where

    def _as_x(self, values: list) -> Any:
        leaves: list = [None] * self.treedef.num_leaves
        for i, value in zip(self.where, values):
            leaves[i] = value
        return self.treedef.unflatten(leaves)

    def show(self, primals: list, cotangents: list) -> None:
        """Print the watched values and their cotangents (host side), in the
        structure of the watched part of `x`."""
        texts = [
            tree_pformat(self._as_x(values), short_arrays=False)
            for values in (primals, cotangents)
        ]
        header = "" if self.name is None else f"{self.name}:\n"
        print(f"{header}   primals={texts[0]}\ncotangents={texts[1]}")

    def check(self, cotangents: list) -> list:
        """`cotangents`, raising through `error_if` if one of them holds a NaN."""
        nan_count = sum(jnp.count_nonzero(jnp.isnan(c)) for c in cotangents)
        where = "" if self.name is None else f" in `{self.name}`"
        return error_if(
            cotangents, nan_count > 0, f"NaN cotangent{where} (`backward_nan`)."
        )


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _identity(arrays: list, watch: _Watch) -> list:
    return arrays


def _identity_fwd(arrays: list, watch: _Watch) -> tuple[list, list]:
    return arrays, arrays


def _identity_bwd(watch: _Watch, arrays: list, cotangents: list) -> tuple[list]:
    jax.debug.callback(watch.show, arrays, cotangents, ordered=True)
    if watch.terminate and cotangents:
        cotangents = watch.check(cotangents)
    return (cotangents,)


_identity.defvjp(_identity_fwd, _identity_bwd)


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
    watched = Slots(x, is_inexact_array)
    watch = _Watch(name, terminate, watched)
    return watched.rebuild(cast(list, _identity(watched.picked(), watch)))
