"""`as_shape`: a shape argument checked once, for the layers and `boxwood.random`."""

from __future__ import annotations

import operator
from typing import Any, cast

import numpy as np


def _dim(value: Any) -> int | None:
    """`value` as a size, or `None` (not an integer; `True` is not a size)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_shape(shape: Any, name: str) -> tuple[int, ...]:
    """`shape` as a tuple of non-negative Python ints (an int means `(shape,)`).
    Floats and bools are refused, as `jax.random` refuses them; the errors name
    `name` (the layer or function)."""
    try:
        dims = (_dim(shape),) if np.ndim(shape) == 0 else tuple(map(_dim, shape))
    except (TypeError, ValueError):  # not iterable, or ragged
        dims = (None,)
    if None in dims:
        raise TypeError(
            f"{name}: `shape` must be an int or a sequence of ints, got {shape!r}."
        )
    sizes = cast(tuple[int, ...], dims)
    if any(s < 0 for s in sizes):
        raise ValueError(f"{name}: `shape` must not be negative, got {sizes}.")
    return sizes
