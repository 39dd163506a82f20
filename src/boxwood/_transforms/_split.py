"""Splitting into arrays and the rest: what every filtered transformation does.

Every filtered transformation does the same three things: split its inputs into
arrays (which the JAX transformation sees) and everything else (which is closed
over), rebuild the inputs inside the transformed function, and carry the non-array
part of the output back out. `Slots` hands a transformation the chosen leaves as a
flat list; `Sieve` hands it the tree with `None` at the other leaves (for a
transformation whose result keeps the tree's structure, as `jax.vjp`'s does).

The output side uses an `OutBox`: the transformed function is created afresh on
every call, stores its non-array outputs in the box while it is traced, and the
caller reads them back afterwards. (Creating the inner function per call also means
JAX's tracing caches, keyed on the function object, can never hand back a trace made
for other static values.) `keystr`, `describe` and `static_equal` name and compare
the leaves that a transformation's error messages report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._filters import is_array, partition

_EMPTY = object()


class OutBox:
    """Holds the non-array part of an output between tracing and the caller."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = _EMPTY

    def put(self, value: Any) -> None:
        self._value = value

    def get(self) -> Any:
        if self._value is _EMPTY:
            raise RuntimeError(
                "boxwood internal error: a transformed function was not traced. "
                "Please report this."
            )
        return self._value


_KEEP = object()


class Slots:
    """A pytree's leaves and the positions of those `predicate` picks: a JAX
    transformation is given only the picked leaves, as a list, and `rebuild`
    puts (possibly transformed) values back at those positions."""

    __slots__ = ("leaves", "treedef", "where")

    def __init__(self, tree: Any, predicate: Callable[[Any], bool]) -> None:
        self.leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        self.where = [i for i, leaf in enumerate(self.leaves) if predicate(leaf)]

    def picked(self) -> list:
        return [self.leaves[i] for i in self.where]

    def rebuild(self, values: Any, others: Any = _KEEP) -> Any:
        """The tree with `values` at the picked positions; every other leaf is
        kept, or set to `others` when given."""
        new = list(self.leaves) if others is _KEEP else [others] * len(self.leaves)
        for i, value in zip(self.where, values, strict=True):
            new[i] = value
        return self.treedef.unflatten(new)


class Sieve:
    """A pytree whose leaves are sorted by a predicate: `kept` is the tree with
    `None` at every leaf the predicate rejects, and `fill(kept)` puts the rejected
    leaves back into a tree shaped like `kept` (for example, `kept` after a JAX
    transformation has replaced its arrays)."""

    __slots__ = ("_leaves", "_treedef", "_marks")

    def __init__(self, tree: Any, predicate: Callable[[Any], bool]) -> None:
        self._leaves, self._treedef = jax.tree_util.tree_flatten(tree)
        self._marks = [bool(predicate(x)) for x in self._leaves]

    @property
    def kept(self) -> Any:
        return self._treedef.unflatten(
            [x if m else None for x, m in zip(self._leaves, self._marks)]
        )

    def fill(self, kept: Any) -> Any:
        new = self._treedef.flatten_up_to(kept)
        return self._treedef.unflatten(
            [n if m else x for x, n, m in zip(self._leaves, new, self._marks)]
        )


def split_out(out: Any, box: OutBox) -> Any:
    """Return the arrays of `out` and put the rest in `box`."""
    dynamic, static = partition(out, is_array)
    box.put(static)
    return dynamic


def keystr(path: tuple) -> str:
    """`jax.tree_util.keystr`, for naming leaves in error messages."""
    return jax.tree_util.keystr(path)


def describe(x: Any) -> str:
    """A short description of a leaf for error messages."""
    if is_array(x):
        return f"an array of shape {tuple(x.shape)} and dtype {x.dtype}"
    text = repr(x)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(x).__name__} {text}"


def static_equal(a: Any, b: Any) -> bool:
    """Whether two non-array leaves are the same (identity, or equal and same type)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False
