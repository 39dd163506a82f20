"""`breakpoint_if`."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._unvmap import unvmap_any


def breakpoint_if(pred: Any, **kwargs: Any) -> Any:
    """`jax.debug.breakpoint` that opens only if `pred` is true (in any element, and
    under `vmap` in any batch element).

    **Arguments:**

    - `pred`: a boolean array.
    - `**kwargs`: passed to `jax.debug.breakpoint` (`token`, `num_frames`, ...).

    **Returns:**

    `token` (from `kwargs`), or `None`.
    """
    branches = (_carry_on, functools.partial(_stop, kwargs))
    stop = unvmap_any(pred).astype(jnp.int32)
    return jax.lax.switch(stop, branches, kwargs.get("token"))


def _carry_on(token: Any) -> Any:
    return token


def _stop(options: dict, _token: Any) -> Any:
    return jax.debug.breakpoint(**options)
