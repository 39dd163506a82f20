"""Constant arrays for layer constructors without compiling anything.

`jnp.ones(shape, dtype)` outside `jit` compiles a small XLA kernel (a
`broadcast_in_dim`) for each new shape, and `jnp.array(0)` one (`stage`) for each
new dtype; a model's constructor pays tens of milliseconds for each. Built in
NumPy and handed over with one `jax.device_put`, the same array (dtype, weak type,
values) costs no compile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def full(shape: int | Sequence[int] | None, value: Any, dtype: Any) -> jax.Array:
    """`jnp.full(shape, value, dtype)` (an int `shape` means `(shape,)`), made on
    the host: same dtype, values and (not weak) type, no compile."""
    shape = () if shape is None else shape
    dtype = jax.dtypes.canonicalize_dtype(np.dtype(dtype))
    return jax.device_put(np.full(shape, value, dtype))


def ones(shape: int | Sequence[int] | None, dtype: Any) -> jax.Array:
    """`jnp.ones(shape, dtype)`, without compiling a kernel (see `full`)."""
    return full(shape, 1, dtype)


def zeros(shape: int | Sequence[int] | None, dtype: Any) -> jax.Array:
    """`jnp.zeros(shape, dtype)`, without compiling a kernel (see `full`)."""
    return full(shape, 0, dtype)


def scalar(value: bool | int) -> jax.Array:
    """`jnp.array(value)` for a Python bool or int, without compiling a kernel:
    a bool array, or a weakly typed default int, as `jnp.array` gives."""
    if not isinstance(value, (bool, int)):
        raise TypeError(f"scalar: expected a Python bool or int, got {value!r}.")
    return jax.device_put(value)
