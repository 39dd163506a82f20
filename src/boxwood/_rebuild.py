"""Fast rebuilding of `filter_jit` outputs from their leaves.

`treedef.unflatten(leaves)` rebuilds a module by calling its class (one Python call
with keyword arguments per module node, about 1.3 us each). A training step returns
the model and the optimizer state, often several copies of the model's structure, so
that cost is paid for every module of every copy on every step.

`compile_builder(treedef)` instead generates, once per output structure, one Python
function whose body is a single expression that builds the whole tree: lists,
tuples, dicts and NamedTuples as literals, and each module with `object.__new__` plus
one assignment of its instance dict (no `__init__`, as in every rebuild). Subtrees of
any other node type are handed to their own treedef's `unflatten`. The result is
identical to `treedef.unflatten(leaves)` (tests check both agree).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ._module._module import Module, _set_dict
from ._module._register import REBUILD_NAME

_MAX_DEPTH = 60  # deeper trees fall back to `unflatten` (Python's parser nests ~200)


def _is_namedtuple(cls: type) -> bool:
    new = getattr(cls, "__new__", None)
    return (
        issubclass(cls, tuple)
        and getattr(new, "__module__", "") == f"namedtuple_{cls.__name__}"
    )


def _is_module(cls: Any) -> bool:
    return (
        isinstance(cls, type)
        and issubclass(cls, Module)
        and "_boxwood_data" in cls.__dict__
    )


class _Emitter:
    """Writes the expression that builds one treedef from the leaf list `L`."""

    def __init__(self, leaf_exprs: list[str]) -> None:
        self.leaf_exprs = leaf_exprs  # the expression for each leaf position
        self.namespace: dict[str, Any] = {
            "_new": object.__new__, "_set": _set_dict, "_tnew": tuple.__new__,
        }  # fmt: skip
        self._names = itertools.count()

    def const(self, value: Any) -> str:
        name = f"_k{next(self._names)}"
        self.namespace[name] = value
        return name

    def emit(self, td: Any, pos: int, depth: int) -> str:
        if td.num_nodes == 1 and td.num_leaves == 1:
            return self.leaf_exprs[pos]
        if depth > _MAX_DEPTH:
            raise RecursionError
        typ, aux = td.node_data()
        if typ is type(None):
            return "None"
        known = typ in (list, tuple, dict) or _is_namedtuple(typ) or _is_module(typ)
        if not known:  # any other node type: its own treedef rebuilds the subtree
            leaves = ", ".join(self.leaf_exprs[pos : pos + td.num_leaves])
            return f"{self.const(td)}.unflatten([{leaves}])"
        parts = []
        for child in td.children():
            parts.append(self.emit(child, pos, depth + 1))
            pos += child.num_leaves
        return self._node(typ, aux, parts)

    def _node(self, typ: type, aux: Any, parts: list[str]) -> str:
        elements = "".join(p + ", " for p in parts)
        if typ is list:
            return f"[{elements}]"
        if typ is tuple:
            return f"({elements})"
        if typ is dict:
            return (
                "{"
                + ", ".join(f"{self.const(k)}: {p}" for k, p in zip(aux, parts))
                + "}"
            )
        if _is_namedtuple(typ):
            return f"_tnew({self.const(typ)}, ({elements}))"
        items = [f"{self.const(n)}: {p}" for n, p in zip(typ._boxwood_data, parts)]
        names = (*typ._boxwood_static, REBUILD_NAME)
        items += [f"{self.const(n)}: {self.const(v)}" for n, v in zip(names, aux)]
        obj = f"_o{next(self._names)}"
        return (
            f"(_set({obj} := _new({self.const(typ)}), {{{', '.join(items)}}}) or {obj})"
        )


def compile_builder(
    treedef: Any, constants: dict[int, Any] | None = None
) -> Callable[[list], Any]:
    """A function `leaves -> pytree` equivalent to `treedef.unflatten(leaves)`.

    With `constants` (leaf position -> value), those leaves are built into the
    function and it takes only the other leaves, in order.
    """
    constants = constants or {}
    emitter = _Emitter([])
    dynamic = 0
    for pos in range(treedef.num_leaves):
        if pos in constants:
            emitter.leaf_exprs.append(emitter.const(constants[pos]))
        else:
            emitter.leaf_exprs.append(f"L[{dynamic}]")
            dynamic += 1
    try:
        expr = emitter.emit(treedef, 0, 0)
    except RecursionError:
        return _merging_unflatten(treedef, constants)
    source = f"def build(L):\n    return {expr}\n"
    code = compile(source, f"<boxwood rebuild of {treedef.num_leaves} leaves>", "exec")
    exec(code, emitter.namespace)
    return emitter.namespace["build"]


def _merging_unflatten(
    treedef: Any, constants: dict[int, Any]
) -> Callable[[list], Any]:
    if not constants:
        return treedef.unflatten

    def build(dyn: list) -> Any:
        it = iter(dyn)
        n = treedef.num_leaves
        return treedef.unflatten(
            [constants[i] if i in constants else next(it) for i in range(n)]
        )

    return build
