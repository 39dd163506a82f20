"""The flat form of modules that `filter_jit` has seen, remembered by identity.

A module is immutable, so its leaves and structure never change; flattening the same
model on every call (inference loops, repeated evaluation) repeats work. This cache
maps `id(module)` to its leaves and a token standing for its structure, so that a
call whose arguments are all arrays or remembered modules skips flattening, hashing
the treedef and checking leaf types (see `_jit.py`).

Only modules whose whole subtree is immutable are remembered: every node a boxwood
`Module`, a tuple, a NamedTuple or `None`, and every leaf a `jax.Array`. A module
holding a list (which could be mutated in place) is always flattened afresh. Each
record holds a weak reference to its module and is dropped when the module dies,
so the cache never keeps a model or its arrays alive.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp

from ._module import Module

ARRAY_TYPE = type(jnp.zeros(()))  # the concrete jax.Array class
ARRAY_TOKEN = object()  # stands for "a jax.Array argument" in a fast-path key


class _Token:
    """Stands for one module structure (treedef) in fast-path keys."""

    __slots__ = ("__weakref__",)


class _Record:
    __slots__ = ("ref", "leaves", "token")

    def __init__(self, ref: Any, leaves: list, token: _Token) -> None:
        self.ref = ref
        self.leaves = leaves
        self.token = token


RECORDS: dict[int, _Record] = {}
_TOKENS: dict[Any, _Token] = {}


def _immutable(treedef: Any) -> bool:
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return True
    typ, _ = treedef.node_data()
    ok = (
        typ is tuple
        or typ is type(None)
        or (
            isinstance(typ, type)
            and issubclass(typ, Module)
            and "_boxwood_data" in typ.__dict__
        )
        or (
            isinstance(typ, type) and issubclass(typ, tuple) and hasattr(typ, "_fields")
        )
    )
    return ok and all(_immutable(child) for child in treedef.children())


def _forget(oid: int) -> Any:
    return lambda _ref: RECORDS.pop(oid, None)


def remember(obj: Any) -> _Record | None:
    """Flatten `obj` and remember it, if it is eligible (see the module docstring)."""
    if not isinstance(obj, Module):
        return None
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    if not leaves or any(type(x) is not ARRAY_TYPE for x in leaves):
        return None
    if not _immutable(treedef):
        return None
    token = _TOKENS.get(treedef)
    if token is None:
        token = _TOKENS.setdefault(treedef, _Token())
    oid = id(obj)
    record = _Record(weakref.ref(obj, _forget(oid)), leaves, token)
    RECORDS[oid] = record
    return record


def lookup(obj: Any) -> _Record | None:
    """The record of `obj` if it is remembered (and is still that object)."""
    record = RECORDS.get(id(obj))
    if record is not None and record.ref() is obj:
        return record
    return None
