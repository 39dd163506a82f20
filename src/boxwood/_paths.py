"""Dotted key paths (`encoder.layers.0.weight`): the one name a user sees for a leaf.

Checkpoint tensor names, sharding rules, summaries and display all use these names;
this module is their only definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

__all__ = ["dotted_path", "leaves_with_dotted_paths"]


def _part(key: Any) -> str:
    if isinstance(key, jtu.GetAttrKey):
        return key.name
    if isinstance(key, jtu.SequenceKey):
        return str(key.idx)
    if isinstance(key, jtu.DictKey):
        return str(key.key)
    if isinstance(key, jtu.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def dotted_path(path: tuple) -> str:
    """The dotted name of a JAX key path: `(GetAttrKey('layers'), SequenceKey(0),
    GetAttrKey('weight'))` becomes `layers.0.weight`.

    Attribute names, sequence indices, dict keys (with `str`) and flattened indices
    are joined with dots; the root (an empty path) is `""`.

    >>> import jax.tree_util as jtu
    >>> dotted_path((jtu.GetAttrKey("layers"), jtu.SequenceKey(0), jtu.DictKey("w")))
    'layers.0.w'
    """
    return ".".join(_part(k) for k in path)


def leaves_with_dotted_paths(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> list[tuple[str, Any]]:
    """Every leaf of `tree` with its dotted path, in JAX's flattening order.

    >>> leaves_with_dotted_paths({"a": (1, 2), "b": None})
    [('a.0', 1), ('a.1', 2)]
    """
    flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [(dotted_path(path), leaf) for path, leaf in flat]
