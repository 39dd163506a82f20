"""The layers' side of initialisation: a parameter from a user's `weight_init=` /
`bias_init=` function, or from the layer's default draw."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._jax_initializers import call_initializer
from ._layout import drawn_shape, to_stored

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
    layout: str | None = None,
) -> Any:
    """`fn(key, drawn, dtype)` in the stored layout, where `drawn` is `shape` in
    JAX's convention for `layout` (see `_layout.py`), checked to return an array
    of that shape; or `default()` when `fn` is `None`.

    **Arguments:**

    - `fn`: the user's initialiser, or `None`.
    - `default`: builds the layer's default parameter.
    - `key`, `shape`, `dtype`: what `fn` is called with.
    - `arg`, `layer`: the keyword and the layer, for error messages.
    - `layout`: `"dense"`, `"conv"`, `"channel_bias"` or `None` (see `_layout.py`).

    **Returns:**

    The parameter, as a JAX array in `dtype`.
    """
    if fn is None:
        return default()
    drawn = drawn_shape(shape, layout)
    out = call_initializer(fn, key, drawn, dtype)
    if not isinstance(out, (jax.Array, np.ndarray)) or tuple(out.shape) != drawn:
        got = getattr(out, "shape", type(out).__name__)
        seen = "" if drawn == shape else f" (stored as {shape})"
        raise ValueError(
            f"{layer}: `{arg}` returned {got}, but it was called with shape "
            f"{drawn}{seen}; an initialiser is called as `fn(key, shape, dtype)` and "
            "must return an array of that shape."
        )
    return to_stored(jnp.asarray(out, dtype), shape, layout)
