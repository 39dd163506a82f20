"""Helpers shared by the layers: default dtype, PyTorch-style initialisation, float32
statistics for low-precision inputs."""

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, PRNGKeyArray

from .._init import uniform


def default_floating_dtype() -> Any:
    """`float64` when JAX runs in 64-bit mode, else `float32`."""
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def resolve_dtype(dtype: Any, name: str) -> Any:
    """`dtype`, or the default floating dtype if `None`; must be inexact."""
    if dtype is None:
        return default_floating_dtype()
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(
            f"{name}: `dtype` must be a floating-point or complex dtype (such as "
            f"jnp.float32 or jnp.bfloat16), got {dtype}."
        )
    return dtype


def uniform_bound(fan_in: int) -> float:
    """`1/sqrt(fan_in)`: the bound of PyTorch's default `Linear`/`Conv` init.

    (For an empty input, `fan_in == 0`, the bound is 0 as in PyTorch.)
    """
    return 0.0 if fan_in == 0 else 1.0 / math.sqrt(fan_in)


def uniform_init(
    key: PRNGKeyArray, shape: Sequence[int], dtype: Any, bound: float
) -> Array:
    """Draw from `U(-bound, bound)` in `dtype` (complex: real and imaginary parts
    drawn independently)."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        real_dtype = jnp.finfo(dtype).dtype
        rkey, ikey = jr.split(key)
        real = jr.uniform(rkey, shape, real_dtype, -bound, bound)
        imag = jr.uniform(ikey, shape, real_dtype, -bound, bound)
        return jax.lax.complex(real, imag).astype(dtype)
    return uniform(key, shape, dtype, -bound, bound)


def compute_dtype(dtype: Any) -> Any:
    """The dtype that statistics are computed in: at least float32.

    `bfloat16`/`float16` inputs are promoted to `float32`; `float32` and wider stay.
    """
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(dtype, jnp.float32)
