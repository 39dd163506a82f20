"""The record layout of an Equinox `.eqx` file, computed from a boxwood tree.

Equinox writes one record per leaf, in flattening order. A few of its layers keep
Python scalars as leaves where boxwood keeps them static: `Dropout.p` and
`.inference`, `BatchNorm.inference`, `SpectralNorm.inference`, the pooling layers'
`init`. In Equinox each of these comes after the layer's array leaves (its fields
are declared in that order), so the layout of a boxwood tree is its own leaves with
one *scalar slot* per such field, placed right after the layer's leaves. Loading
and saving walk this layout record for record: nothing is guessed from shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.tree_util as jtu


class Slot(NamedTuple):
    """One record position: a leaf of the tree (`scalar=False`), or a Python scalar
    that Equinox keeps as a leaf and boxwood as a static field (`scalar=True`)."""

    path: tuple
    value: Any
    scalar: bool


def _scalar_fields(x: Any) -> tuple[str, ...]:
    """The static fields of `x` that Equinox stores as leaves, in Equinox's order."""
    from ..nn import BatchNorm, Dropout, Pool, SpectralNorm

    if isinstance(x, Dropout):
        return ("p", "inference")
    if isinstance(x, (BatchNorm, SpectralNorm)):
        return ("inference",)
    if isinstance(x, Pool):
        return ("init",)
    return ()


def equinox_slots(tree: Any, is_leaf: Callable | None = None) -> list[Slot]:
    """Every record position of `tree` in Equinox's layout, in file order.

    The non-scalar slots are exactly `jax.tree_util.tree_flatten(tree, is_leaf)`'s
    leaves, in order, so the tree is rebuilt from them with its treedef.
    """
    slots: list[Slot] = []
    _walk(tree, (), is_leaf, slots)
    return slots


def _walk(tree: Any, prefix: tuple, is_leaf: Callable | None, out: list) -> None:
    def stop(x: Any) -> bool:
        if is_leaf is not None and is_leaf(x):
            return True
        return x is not tree and bool(_scalar_fields(x))

    own = () if is_leaf is not None and is_leaf(tree) else _scalar_fields(tree)
    for path, x in jtu.tree_flatten_with_path(tree, is_leaf=stop)[0]:
        if x is not tree and not (is_leaf is not None and is_leaf(x)):
            if _scalar_fields(x):
                _walk(x, prefix + path, is_leaf, out)
                continue
        out.append(Slot(prefix + path, x, False))
    for name in own:
        path = prefix + (jtu.GetAttrKey(name),)
        out.append(Slot(path, getattr(tree, name), True))
