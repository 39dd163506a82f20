"""`unvmap_any`, `unvmap_all`, `unvmap_max`: reductions that see through `vmap`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax import custom_batching


def _unvmapped(reduce: Callable, name: str, doc: str) -> Callable:
    @custom_batching.custom_vmap
    def fn(x: Any) -> Any:
        return reduce(jnp.asarray(x))

    # Under `vmap` the batch axis is just another axis to reduce over. Calling `fn`
    # again (not `reduce`) lets an enclosing `vmap` reduce its own axis too.
    @fn.def_vmap
    def _rule(axis_size: int, in_batched: list, x: Any) -> tuple:
        del axis_size, in_batched
        return fn(x), False

    def unvmap(x: Any) -> Any:
        return fn(x)

    unvmap.__name__ = unvmap.__qualname__ = name
    unvmap.__doc__ = doc
    return unvmap


unvmap_any = _unvmapped(
    jnp.any,
    "unvmap_any",
    """`jnp.any` over every element of `x`, including across every `vmap` axis.

    **Arguments:**

    - `x`: a boolean array.

    **Returns:**

    A scalar boolean array, the same for every batch element.

    >>> import jax, jax.numpy as jnp
    >>> from boxwood.internal import unvmap_any
    >>> jax.vmap(unvmap_any)(jnp.array([False, True]))
    Array([ True,  True], dtype=bool)
    """,
)
unvmap_all = _unvmapped(
    jnp.all,
    "unvmap_all",
    """`jnp.all` over every element of `x`, including across every `vmap` axis.

    **Arguments:**

    - `x`: a boolean array.

    **Returns:**

    A scalar boolean array, the same for every batch element.

    >>> import jax, jax.numpy as jnp
    >>> from boxwood.internal import unvmap_all
    >>> jax.vmap(unvmap_all)(jnp.array([False, True]))
    Array([False, False], dtype=bool)
    """,
)
unvmap_max = _unvmapped(
    jnp.max,
    "unvmap_max",
    """`jnp.max` over every element of `x`, including across every `vmap` axis.

    **Arguments:**

    - `x`: a non-empty array.

    **Returns:**

    A scalar array, the same for every batch element.

    >>> import jax, jax.numpy as jnp
    >>> from boxwood.internal import unvmap_max
    >>> jax.vmap(unvmap_max)(jnp.array([1, 3, 2]))
    Array([3, 3, 3], dtype=int32)
    """,
)
