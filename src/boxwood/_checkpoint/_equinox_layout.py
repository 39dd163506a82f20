"""The record layout of an Equinox `.eqx` file, computed from a boxwood tree.

Equinox writes one record per leaf, in flattening order. A few of its layers keep
Python scalars as leaves where boxwood keeps them static fields (`Dropout.p`,
`inference` flags, the pooling layers' `init`). Each such layer says so itself:
its class attribute `equinox_scalar_fields` names those fields, in Equinox's
order (default when absent: `()`, no such field). Equinox declares these fields
after the layer's array fields, so each becomes a *scalar slot* placed right after
the layer's own leaves. Loading and saving walk this layout record by record:
nothing is guessed from shapes.

A layer defined outside boxwood declares its fields the same way::

    class Scale(boxwood.Module):
        weight: jax.Array
        factor: float = boxwood.field(static=True)
        equinox_scalar_fields = ("factor",)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.tree_util as jtu
import numpy as np

SCALAR_FIELDS = "equinox_scalar_fields"
_SCALAR_TYPES = (bool, int, float, np.bool_, np.integer, np.floating)


class Slot(NamedTuple):
    """One record position: a leaf of the tree (`scalar=False`), or a Python scalar
    that Equinox keeps as a leaf and boxwood as a static field (`scalar=True`)."""

    path: tuple
    value: Any
    scalar: bool


def scalar_fields(node: Any) -> tuple[str, ...]:
    """The fields of `node` that Equinox stores as leaves: its class's
    `equinox_scalar_fields`, checked."""
    names = getattr(type(node), SCALAR_FIELDS, ())
    cls = type(node).__name__
    if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"{cls}.{SCALAR_FIELDS} must be a tuple of field names (strings), got "
            f"{names!r}; write e.g. `{SCALAR_FIELDS} = ('p',)` in the class body."
        )
    for name in names:
        value = getattr(node, name, None)
        if not isinstance(value, _SCALAR_TYPES):
            raise TypeError(
                f"{cls}.{SCALAR_FIELDS} names `{name}`, whose value is {value!r}: "
                "only fields holding a Python bool, int or float are stored as "
                f"Equinox scalar records. Remove `{name}` from {SCALAR_FIELDS}."
            )
    return names


def equinox_slots(tree: Any, is_leaf: Callable | None = None) -> list[Slot]:
    """Every record position of `tree` in Equinox's layout, in file order.

    The non-scalar slots are exactly `jax.tree_util.tree_flatten(tree, is_leaf)`'s
    leaves, in order, so the tree is rebuilt from them with its treedef. A node for
    which `is_leaf` holds is one leaf, whatever it declares.
    """

    def opaque(x: Any) -> bool:
        return is_leaf is not None and bool(is_leaf(x))

    def declares(x: Any) -> bool:
        return not opaque(x) and bool(scalar_fields(x))

    slots: list[Slot] = []

    def visit(node: Any, prefix: tuple) -> None:
        # Flatten `node` down to leaves and to the nested nodes that declare
        # scalar fields; those are visited in turn, at their place in the order.
        def stop(x: Any) -> bool:
            return opaque(x) or (x is not node and declares(x))

        for path, x in jtu.tree_flatten_with_path(node, is_leaf=stop)[0]:
            if x is not node and declares(x):
                visit(x, prefix + path)
            else:
                slots.append(Slot(prefix + path, x, False))
        if declares(node):
            slots.extend(
                Slot(prefix + (jtu.GetAttrKey(name),), getattr(node, name), True)
                for name in scalar_fields(node)
            )

    visit(tree, ())
    return slots
