"""Input checks shared by the layers: errors that name the layer and the shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp


def layer_name(layer: Any, *names: str) -> str:
    """`Linear(in_features=3)`-style name of a layer, with the given static fields."""
    parts = ", ".join(f"{n}={getattr(layer, n)!r}" for n in names)
    return f"{type(layer).__name__}({parts})"


def check_input(
    x: Any, expected: Sequence[int | str | None], name: str, *, what: str = "input"
) -> None:
    """Raise `ValueError` unless `x.shape` matches `expected`.

    `expected` holds ints (that size), `None` (any size) or strings (any size, shown
    in the message as that name, e.g. "length").
    """
    shape = tuple(jnp.shape(x))
    ok = len(shape) == len(expected) and all(
        not isinstance(e, int) or e == s for e, s in zip(expected, shape)
    )
    if not ok:
        shown = (
            "("
            + ", ".join(str(e) for e in expected)
            + ("," if len(expected) == 1 else "")
            + ")"
        )
        raise ValueError(f"{name}: expected {what} of shape {shown}, got {shape}.")
