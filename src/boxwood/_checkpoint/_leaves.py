"""A tree's array leaves as named tensors, and the fingerprint of its structure.

Tensor names are the leaves' dotted key paths (`boxwood._paths`, the one owner of
that naming scheme). An array leaf is a `jax.Array`, a NumPy array or scalar, or
(in a `like` tree) a `jax.ShapeDtypeStruct`; every other leaf is code or
configuration and is not stored. Typed PRNG keys are stored as their key data
(`uint32`), with the key implementation recorded in the file's metadata.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._paths import dotted_path
from ._error import CheckpointError


def is_stored(x: Any) -> bool:
    """Whether a leaf is an array that a checkpoint stores."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def is_key_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


@dataclass(frozen=True)
class Leaf:
    """One stored leaf: its name, its value, and (for a typed key) its key impl."""

    name: str
    value: Any
    key_impl: str | None

    @property
    def shape(self) -> tuple[int, ...]:
        """The stored shape: a key array's shape plus its key-data axis."""
        if self.key_impl is None:
            return tuple(self.value.shape)
        return tuple(self.value.shape) + tuple(self.value.dtype._impl.key_shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint32) if self.key_impl else np.dtype(self.value.dtype)


def key_impl_name(x: Any) -> str | None:
    """The name of a typed key array's implementation (`"threefry2x32"`), else None.

    Read from the dtype, which `jax.ShapeDtypeStruct`s have too
    (`jax.random.key_impl` takes only concrete key arrays).
    """
    if not is_key_dtype(x.dtype):
        return None
    return str(x.dtype._impl.name)


def stored_leaves(tree: Any) -> tuple[list[Leaf], list[tuple[Any, Any]], Any]:
    """The stored leaves of `tree`, all `(path, leaf)` pairs, and the treedef.

    **Raises** `CheckpointError` when two leaves have the same dotted name (dict
    keys containing dots can collide with nested names).
    """
    pairs, treedef = jtu.tree_flatten_with_path(tree)
    leaves, seen = [], {}
    for path, x in pairs:
        if not is_stored(x):
            continue
        name = dotted_path(path)
        if name in seen:
            raise CheckpointError(
                f"Two leaves share the checkpoint name {name!r}: "
                f"`{jtu.keystr(seen[name])}` and `{jtu.keystr(path)}`. Rename a "
                "dict key so that dotted paths are unique."
            )
        seen[name] = path
        leaves.append(Leaf(name, x, key_impl_name(x)))
    return leaves, pairs, treedef


def stored_names(tree: Any) -> list[str]:
    """The checkpoint names of `tree`'s stored leaves, in flattening order."""
    return [leaf.name for leaf in stored_leaves(tree)[0]]


def fingerprint(leaves: list[Leaf]) -> str:
    """A short hash of the stored leaves' names, dtypes and shapes, in order.

    Two trees with the same fingerprint load each other's checkpoints.
    """
    h = hashlib.sha256()
    for leaf in leaves:
        h.update(f"{leaf.name}:{leaf.dtype.str}:{leaf.shape};".encode())
    return h.hexdigest()[:16]
