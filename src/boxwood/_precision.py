"""`cast_floating`: one dtype for a tree's floating-point arrays (mixed precision)."""

from __future__ import annotations

from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from ._filters import is_array

_T = TypeVar("_T")


def _floating_dtype(dtype: Any) -> Any:
    """`dtype` as a NumPy dtype; it must be a real floating-point one."""
    try:
        resolved = jnp.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
        raise TypeError(
            "`cast_floating`: `dtype` must be a floating-point dtype such as "
            f"`jnp.bfloat16`, `jnp.float16` or `jnp.float32`, got {dtype!r}. "
            "Integer, boolean, complex and PRNG-key arrays are never cast; to cast "
            "every array, use `jax.tree.map(lambda x: x.astype(dtype), tree)`."
        )
    return resolved


def cast_floating(tree: _T, dtype: Any) -> _T:
    """Casts every floating-point array of `tree` to `dtype`.

    Integer, boolean and complex arrays, PRNG keys, Python numbers and every
    non-array leaf (static fields, functions) are returned as they are, so a whole
    model can be cast: its token ids, counters and keys keep their dtypes.

    The cast is an ordinary differentiable JAX operation: differentiating through
    `cast_floating(params, jnp.bfloat16)` gives gradients in the dtype of `params`.
    This is the mixed-precision pattern: float32 master parameters, computation in
    bfloat16 (see the models guide, *Mixed precision*).

    **Arguments:**

    - `tree`: any pytree (a module, a dict of arrays, ...). JAX and NumPy arrays
      are cast (each stays a JAX or NumPy array); arrays already in `dtype` are
      returned unchanged.
    - `dtype`: a real floating-point dtype (`jnp.bfloat16`, `jnp.float16`,
      `jnp.float32`, ...).

    **Returns:** a tree of the same structure.

    **Raises:** `TypeError` if `dtype` is not a floating-point dtype.

    ```python
    >>> import jax, jax.numpy as jnp, boxwood as bw
    >>> params = {"w": jnp.ones(3), "step": jnp.array(7), "key": jax.random.key(0)}
    >>> low = bw.cast_floating(params, jnp.bfloat16)
    >>> low["w"].dtype, low["step"].dtype, low["key"] is params["key"]
    (dtype(bfloat16), dtype('int32'), True)
    >>> loss = lambda w: jnp.sum(bw.cast_floating(w, jnp.bfloat16) ** 2)
    >>> jax.grad(loss)(params["w"]).dtype  # the gradient comes back in float32
    dtype('float32')

    ```
    """
    target = _floating_dtype(dtype)

    def cast(leaf: Any) -> Any:
        if not is_array(leaf) or not jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf
        return leaf if leaf.dtype == target else leaf.astype(target)

    return jax.tree.map(cast, tree)
