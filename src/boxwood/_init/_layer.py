"""The layers' side of initialisation: a parameter from a user's `weight_init=` /
`bias_init=` function, or from the layer's default draw."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: `(key, shape, dtype) -> array`, such as any `jax.nn.initializers` function.
Initializer = Callable[[Any, tuple[int, ...], Any], Any]


def check_initializer(fn: Any, arg: str, layer: str) -> None:
    """`TypeError` naming `arg` unless `fn` is `None` or callable."""
    if fn is not None and not callable(fn):
        raise TypeError(
            f"{layer}: `{arg}` must be a function `(key, shape, dtype) -> array` (such "
            f"as `jax.nn.initializers.lecun_normal()`) or None, got "
            f"{type(fn).__name__}."
        )


def init_param(
    fn: Initializer | None,
    default: Callable[[], Any],
    key: Any,
    shape: tuple[int, ...],
    dtype: Any,
    arg: str,
    layer: str,
) -> Any:
    """`fn(key, shape, dtype)`, checked to return an array of that shape, or
    `default()` when `fn` is `None`.

    **Arguments:**

    - `fn`: the user's initialiser, or `None`.
    - `default`: builds the layer's default parameter.
    - `key`, `shape`, `dtype`: what `fn` is called with.
    - `arg`, `layer`: the keyword and the layer, for error messages.

    **Returns:**

    The parameter, as a JAX array in `dtype`.
    """
    if fn is None:
        return default()
    out = fn(key, shape, dtype)
    if not isinstance(out, (jax.Array, np.ndarray)) or tuple(out.shape) != shape:
        got = getattr(out, "shape", type(out).__name__)
        raise ValueError(
            f"{layer}: `{arg}` returned {got}, but the parameter has shape {shape}; "
            "an initialiser is called as `fn(key, shape, dtype)` and must return an "
            "array of that shape."
        )
    return jnp.asarray(out, dtype)
