"""`breakpoint_if`."""

from __future__ import annotations

from typing import Any

import jax

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
    token = kwargs.get("token")
    return jax.lax.cond(
        unvmap_any(pred), lambda: jax.debug.breakpoint(**kwargs), lambda: token
    )
