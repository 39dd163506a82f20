"""`announce_transform`: an identity that reports the transformations applied to
it, through the primitive `announce_jaxpr_p` (`boxwood/_announce.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._announce import Watch, announce_jaxpr_p
from .._filters import combine, is_array, partition


def announce_transform(
    x: Any,
    name: str | None = None,
    intermediates: bool = False,
    announce: Callable[[str], Any] = print,
) -> Any:
    """Return `x` unchanged, announcing each JAX transformation applied to it.

    Each announcement names the transformations so far and the stage reached:
    `vmap:abstract` (traced), `vmap:mlir` (lowered for compilation), `jvp:impl`
    (run eagerly), `jvp:transpose:impl` (the backward pass). For one-off debugging.

    **Arguments:**

    - `x`: any pytree; its arrays are watched.
    - `name`: a prefix shown as `(name) ` before each announcement.
    - `intermediates`: also announce each transformation as it starts.
    - `announce`: the function called with each announcement; `print` by default.

    **Returns:**

    `x`.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> f = lambda x: boxwood.debug.announce_transform(x, name="x")
    >>> _ = jax.jit(jax.vmap(f))(jnp.ones(2))
    (x) vmap:abstract
    (x) vmap:mlir
    """
    arrays, rest = partition(x, is_array)
    leaves, structure = jax.tree_util.tree_flatten(arrays)
    prefix = "" if name is None else f"({name}) "
    watch = Watch(prefix, announce, bool(intermediates))
    out = announce_jaxpr_p.bind(*leaves, watch=watch)
    return combine(jax.tree_util.tree_unflatten(structure, out), rest)
