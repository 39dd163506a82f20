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

For `filter_jit` (`remember=True`), the outermost modules of an output are built
from their flat form alone (see `_flat_cache.py`): a model returned by one training
step is passed to the next without being flattened again, and its nested modules
(and those of the optimiser state) are built only if something reads them
(`_module._LazyField`). A step then creates a handful of objects instead of one per
module of every copy of the model.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

from ._flat_cache import immutable, is_module_class, token_for
from ._module._module import FLAT, _set_dict
from ._module._register import REBUILD_NAME

_MAX_DEPTH = 60  # deeper trees fall back to `unflatten` (Python's parser nests ~200)


def _is_namedtuple(cls: type) -> bool:
    new = getattr(cls, "__new__", None)
    return (
        issubclass(cls, tuple)
        and getattr(new, "__module__", "") == f"namedtuple_{cls.__name__}"
    )


class _Emitter:
    """Writes the expression that builds one treedef from the leaf list `L`."""

    def __init__(self, remember: bool) -> None:
        self.leaf_exprs: list[str] = []  # the expression for each leaf position
        self.dyn_index: list[int | None] = []  # its index in `L` (None: a constant)
        self.remember = remember
        self.namespace: dict[str, Any] = {
            "_new": object.__new__, "_set": _set_dict, "_tnew": tuple.__new__,
        }  # fmt: skip
        self._names = itertools.count()

    def const(self, value: Any) -> str:
        name = f"_k{next(self._names)}"
        self.namespace[name] = value
        return name

    def emit(self, td: Any, pos: int, depth: int, outer: bool = True) -> str:
        """The expression for the subtree `td` whose first leaf is at `pos`;
        `outer`: no module encloses it."""
        if td.num_nodes == 1 and td.num_leaves == 1:
            return self.leaf_exprs[pos]
        if depth > _MAX_DEPTH:
            raise RecursionError
        typ, aux = td.node_data()
        if typ is type(None):
            return "None"
        module = is_module_class(typ)
        known = typ in (list, tuple, dict) or _is_namedtuple(typ) or module
        if not known:  # any other node type: its own treedef rebuilds the subtree
            leaves = ", ".join(self.leaf_exprs[pos : pos + td.num_leaves])
            return f"{self.const(td)}.unflatten([{leaves}])"
        record = self._record(td, pos) if module and outer and self.remember else None
        if record is not None:  # built from its flat form; fields on first read
            return self._module(typ, aux, None, record)
        parts = []
        for child in td.children():
            parts.append(self.emit(child, pos, depth + 1, outer and not module))
            pos += child.num_leaves
        if module:
            return self._module(typ, aux, parts, None)
        return self._node(typ, aux, parts)

    def _record(self, td: Any, pos: int) -> str | None:
        """The flat form to attach to an outermost module (`_flat_cache.py`), when
        all its leaves are arrays returned by the computation (no constants) and its
        subtree is immutable."""
        dyn = self.dyn_index[pos : pos + td.num_leaves]
        if not dyn or None in dyn or not immutable(td):
            return None
        return f"({self.const(token_for(td))}, L[{dyn[0]}:{dyn[-1] + 1}])"

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
        return f"_tnew({self.const(typ)}, ({elements}))"  # a NamedTuple

    def _module(
        self, typ: type, aux: Any, parts: list[str] | None, record: str | None
    ) -> str:
        """A module with its data fields (`parts`), or, given only its flat form
        (`record`), with its static fields and flat form alone: the data fields are
        rebuilt from it when first read (`_module._LazyField`)."""
        items = []
        if parts is not None:
            items += [f"{self.const(n)}: {p}" for n, p in zip(typ._boxwood_data, parts)]
        names = (*typ._boxwood_static, REBUILD_NAME)
        items += [f"{self.const(n)}: {self.const(v)}" for n, v in zip(names, aux)]
        if record is not None:
            items.append(f"{self.const(FLAT)}: {record}")
        obj = f"_o{next(self._names)}"
        return (
            f"(_set({obj} := _new({self.const(typ)}), {{{', '.join(items)}}}) or {obj})"
        )


def compile_builder(
    treedef: Any, constants: dict[int, Any] | None = None, remember: bool = False
) -> Callable[[list], Any]:
    """A function `leaves -> pytree` equivalent to `treedef.unflatten(leaves)`.

    With `constants` (leaf position -> value), those leaves are built into the
    function and it takes only the other leaves, in order. With `remember`, each
    outermost module whose leaves are all taken from the list (and whose subtree is
    immutable) is built from its flat form alone (see `_flat_cache.py`), its fields
    filled in when first read: the list passed in must then hold only arrays.
    """
    constants = constants or {}
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and not constants:
        return operator.itemgetter(0)  # one array: no Python frame at all
    emitter = _Emitter(remember)
    dynamic = 0
    for pos in range(treedef.num_leaves):
        if pos in constants:
            emitter.leaf_exprs.append(emitter.const(constants[pos]))
            emitter.dyn_index.append(None)
        else:
            emitter.leaf_exprs.append(f"L[{dynamic}]")
            emitter.dyn_index.append(dynamic)
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
