"""`Static`: hold any value in the pytree structure."""

from __future__ import annotations

from typing import Any

import jax

from .._module import Module, field


class Static(Module):
    """Wrap a value so that it is part of the pytree structure (static), not a leaf:
    for returning non-arrays through a JAX transformation.

    The value is stored flattened (its leaves and treedef), so it is compared by its
    leaves, never by its own `__eq__`.

    >>> import jax
    >>> from boxwood.internal import Static
    >>> s = Static({"activation": "relu"})
    >>> jax.tree_util.tree_leaves(s), s.value
    ([], {'activation': 'relu'})
    """

    _leaves: tuple = field(static=True)
    _treedef: Any = field(static=True)

    def __init__(self, value: Any):
        leaves, self._treedef = jax.tree_util.tree_flatten(value)
        self._leaves = tuple(leaves)

    @property
    def value(self) -> Any:
        """The wrapped value."""
        return jax.tree_util.tree_unflatten(self._treedef, self._leaves)
