"""`Static`: hold any value in the pytree structure."""

from __future__ import annotations

from typing import Any

import jax

from .._module import Module, field


class _ByLeaves:
    """A value compared and hashed through its pytree structure and leaves, never
    through its own `__eq__`/`__hash__` (which a container may lack)."""

    __slots__ = ("value", "_identity")

    def __init__(self, value: Any) -> None:
        self.value = value
        leaves, treedef = jax.tree_util.tree_flatten(value)
        self._identity = (treedef, tuple(leaves))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByLeaves) and self._identity == other._identity

    def __hash__(self) -> int:
        return hash(self._identity)

    def __repr__(self) -> str:
        return repr(self.value)


class Static(Module):
    """Wrap a value so that it is part of the pytree structure (static), not a leaf:
    for returning non-arrays through a JAX transformation.

    Two `Static`s are equal when their values have the same pytree structure and
    equal leaves; the value's own `__eq__` is never used.

    >>> import jax
    >>> from boxwood.internal import Static
    >>> s = Static({"activation": "relu"})
    >>> jax.tree_util.tree_leaves(s), s.value
    ([], {'activation': 'relu'})
    """

    _held: _ByLeaves = field(static=True)

    def __init__(self, value: Any):
        self._held = _ByLeaves(value)

    @property
    def value(self) -> Any:
        """The wrapped value."""
        return self._held.value
