"""Fast rebuilding of `filter_jit` outputs from their leaves.

`treedef.unflatten(leaves)` rebuilds a module by calling its class (one Python call
with keyword arguments per module node, about 1.3 us each). A training step returns
the model and the optimizer state, often several copies of the model's structure, so
that cost is paid for every module of every copy on every step.

`compile_builder(treedef)` instead turns each output structure, once, into a small
program (a tree of tuples: lists, tuples, dicts, NamedTuples, and each module as
`object.__new__` plus one assignment of its instance dict, with no `__init__`, as in
every rebuild). Subtrees of any other node type are handed to their own treedef's
`unflatten`. The program becomes one generated Python function whose body is a
single expression. The result is identical to `treedef.unflatten(leaves)` (tests
check both agree).

For `filter_jit` (`remember=True`), the outermost modules of an output are built
from their flat form alone (see `_flat_key.py`): a model returned by one training
step is passed to the next without being flattened again, and its nested modules
(and those of the optimiser state) are built only if something reads them
(`_field_descriptors.py`'s `_Field`). A step then creates a handful of objects instead of one per
module of every copy of the model.
"""

from __future__ import annotations

import array
import collections
import copy
import enum
import itertools
import operator
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._filters import is_array
from ._flat_form import FLAT
from ._flat_key import immutable, is_module_class, token_for
from ._register import REBUILD_NAME
from ._slots import set_dict

_MAX_DEPTH = 60  # deeper trees fall back to `unflatten` (Python's parser nests ~200)


def _is_namedtuple(cls: type) -> bool:
    new = getattr(cls, "__new__", None)
    return (
        issubclass(cls, tuple)
        and getattr(new, "__module__", "") == f"namedtuple_{cls.__name__}"
    )


# Opcodes of a build program: a tree of tuples, each starting with its opcode.
LEAF, CONST, LIST, TUPLE, NTUPLE, DICT, MODULE, LAZY, CALL = range(9)
# where a node keeps its children (the tuple of child nodes)
_CHILDREN_AT = {LIST: 1, TUPLE: 1, NTUPLE: 2, DICT: 2, MODULE: 3, CALL: 2}


class _Emitter:
    """Turns one treedef into a build program (see `compile_builder`)."""

    def __init__(self, remember: bool, constants: dict[int, Any]) -> None:
        self.leaf_nodes: list[tuple] = []  # the node for each leaf position
        self.dyn_index: list[int | None] = []  # its index in the list (None: constant)
        self.remember = remember
        self.constants = constants  # leaf position -> static value

    def emit(self, td: Any, pos: int, depth: int, outer: bool = True) -> tuple:
        """The node for the subtree `td` whose first leaf is at `pos`; `outer`: no
        module encloses it."""
        if td.num_nodes == 1 and td.num_leaves == 1:
            return self.leaf_nodes[pos]
        if depth > _MAX_DEPTH:
            raise RecursionError
        typ, aux = td.node_data()
        if typ is type(None):
            return (CONST, None)
        # (a class keeping fields in `__slots__` is built by its own unflatten)
        module = is_module_class(typ) and not typ._boxwood_slots
        if module and outer and self.remember:
            lazy = self._lazy(td, typ, aux, pos)
            if lazy is not None:  # built from its flat form; fields on first read
                return lazy
        parts = []
        for child in td.children():
            parts.append(self.emit(child, pos, depth + 1, outer and not module))
            pos += child.num_leaves
        parts = tuple(parts)
        if module:
            return (MODULE, typ, tuple(typ._boxwood_data), parts, _statics(typ, aux))
        if typ is list:
            return (LIST, parts)
        if typ is tuple:
            return (TUPLE, parts)
        if typ is dict:
            return (DICT, tuple(aux), parts)
        if _is_namedtuple(typ):
            if not parts:  # e.g. optax's `EmptyState()`: immutable, built once
                return (CONST, tuple.__new__(typ, ()))
            return (NTUPLE, typ, parts)
        # any other node type: its registered unflatten, over its built children
        return (CALL, _one_level(td).unflatten, parts)

    def _lazy(self, td: Any, typ: type, aux: Any, pos: int) -> tuple | None:
        """An outermost module with its static fields and flat form alone
        (`_flat_key.py`), when its subtree is immutable and its leaves are arrays
        returned by the computation or static values that are neither copied per
        call (`_copies`) nor unhashable (they go in the token)."""
        dyn = self.dyn_index[pos : pos + td.num_leaves]
        if not dyn or not immutable(td):
            return None
        statics = tuple(
            (i, self.constants[pos + i]) for i, d in enumerate(dyn) if d is None
        )
        if any(_copies(value) or is_array(value) for _, value in statics):
            return None  # (a NumPy constant is a dynamic leaf to the next call)
        token = token_for(td, statics)
        if token is None:
            return None
        arrays = [d for d in dyn if d is not None]
        start = arrays[0] if arrays else 0
        return (LAZY, typ, _statics(typ, aux), token, start, start + len(arrays))


# Leaf types whose values cannot change (see also `_MUTABLE_CONTAINERS`, the static
# output leaves that are copied on every call).
_IMMUTABLE = frozenset(
    {object, int, float, complex, bool, str, bytes, type(None), type(Ellipsis), range,
     slice, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
     types.ModuleType, types.CodeType, np.dtype}
)  # fmt: skip


# ... and their subclasses (a metaclass's classes, say `jnp.float32`)
_IMMUTABLE_BASES = (
    type, enum.Enum, np.generic, np.dtype, jax.sharding.Sharding,
    jax.sharding.PartitionSpec,
)  # fmt: skip


def is_immutable_value(value: Any) -> bool:
    """Whether `value` cannot be changed in place (so one object may be returned by
    every call): numbers, strings, bytes, `None`, types and functions, enum members,
    NumPy dtypes and scalars, shardings and partition specs, plain `object()`
    sentinels, and frozensets of those."""
    typ = type(value)
    if typ in _IMMUTABLE or isinstance(value, _IMMUTABLE_BASES):
        return True
    if typ is frozenset:
        return all(map(is_immutable_value, value))
    return False


def _fresh(children: list) -> Any:
    """A shallow copy of the one child: a mutable static output, per call."""
    return copy.copy(children[0])


# Python's own containers that change in place. A static output leaf that is one of
# these (a `set`, a `bytearray`, a `Counter`: list and dict subclasses that are not
# pytree nodes) is copied on every call; any other object (a function, a jitted
# function, an object of the user's own class) is returned as it is, as JAX and
# Equinox return it.
_MUTABLE_CONTAINERS = (
    set, bytearray, list, dict, collections.deque, array.array,
)  # fmt: skip


def _copies(value: Any) -> bool:
    """Whether a static output leaf is copied on every call: it is one of Python's
    mutable containers (`_MUTABLE_CONTAINERS`)."""
    return isinstance(value, _MUTABLE_CONTAINERS) and not is_immutable_value(value)


def _constant_node(value: Any) -> tuple:
    """The node of a static output leaf: the value itself, or (`_copies`) a shallow
    copy of it made on every call."""
    if _copies(value):
        return (CALL, _fresh, ((CONST, value),))
    return (CONST, value)


def _one_level(td: Any) -> Any:
    """The treedef of `td`'s root node whose children are leaves: its `unflatten`
    takes the already-built children."""
    leaf = jax.tree_util.tree_structure(0)
    return jax.tree_util.PyTreeDef.from_node_data_and_children(
        jax.tree_util.default_registry, td.node_data(), [leaf] * len(td.children())
    )


def _statics(typ: type, aux: Any) -> dict:
    """A module's static fields (and its static key) as they go in its dict."""
    return dict(zip((*typ._boxwood_static, REBUILD_NAME), aux))


class _Source:
    """Turns a build program into one Python expression over the leaf list `L`.
    Lists, tuples, dicts and
    NamedTuples are literals; each module is `object.__new__` plus one assignment
    of its instance dict."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {
            "_new": object.__new__, "_set": set_dict, "_tnew": tuple.__new__,
        }  # fmt: skip
        self._names = itertools.count()

    def const(self, value: Any) -> str:
        name = f"_k{next(self._names)}"
        self.namespace[name] = value
        return name

    def expr(self, node: tuple) -> str:
        op = node[0]
        if op == LEAF:
            return f"L[{node[1]}]"
        if op == CONST:
            return "None" if node[1] is None else self.const(node[1])
        if op == LAZY:
            _, typ, statics, token, start, stop = node
            values = f"{{**{self.const(statics)}, {FLAT!r}: ({self.const(token)}, L[{start}:{stop}])}}"
            return self._module(typ, values)
        children = [self.expr(child) for child in node[_CHILDREN_AT[op]]]
        elements = "".join(c + ", " for c in children)
        if op == LIST:
            return f"[{elements}]"
        if op == TUPLE:
            return f"({elements})"
        if op == NTUPLE:
            return f"_tnew({self.const(node[1])}, ({elements}))"
        if op == DICT:
            keys = [self.const(k) for k in node[1]]
            return "{" + "".join(f"{k}: {c}, " for k, c in zip(keys, children)) + "}"
        if op == MODULE:
            _, typ, names, _, statics = node
            items = "".join(f"{n!r}: {c}, " for n, c in zip(names, children))
            return self._module(typ, f"{{{items}**{self.const(statics)}}}")
        return f"{self.const(node[1])}([{elements}])"  # CALL

    def _module(self, typ: type, values: str) -> str:
        obj = f"_o{next(self._names)}"
        return f"(_set({obj} := _new({self.const(typ)}), {values}) or {obj})"


def compile_builder(
    treedef: Any, constants: dict[int, Any] | None = None, remember: bool = False
) -> Callable[[list], Any]:
    """A function `leaves -> pytree` equivalent to `treedef.unflatten(leaves)`.

    With `constants` (leaf position -> value), those leaves are built into the
    function and it takes only the other leaves, in order; a constant that can be
    changed in place (`is_immutable_value` is false: a `set`, a user object) is
    copied (`copy.copy`) on every call, so that no two calls return the same one. With `remember`, each
    outermost module whose leaves are all taken from the list (and whose subtree is
    immutable) is built from its flat form alone (see `_flat_key.py`), its fields
    filled in when first read: the list passed in must then hold only arrays.

    The treedef becomes a program once, then one generated Python function.
    """
    constants = constants or {}
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and not constants:
        return operator.itemgetter(0)  # one array: no Python frame at all
    emitter = _Emitter(remember, constants)
    dynamic = 0
    for pos in range(treedef.num_leaves):
        if pos in constants:
            emitter.leaf_nodes.append(_constant_node(constants[pos]))
            emitter.dyn_index.append(None)
        else:
            emitter.leaf_nodes.append((LEAF, dynamic))
            emitter.dyn_index.append(dynamic)
            dynamic += 1
    try:
        program = emitter.emit(treedef, 0, 0)
    except RecursionError:
        return _merging_unflatten(treedef, constants)
    source = _Source()
    text = f"def build(L):\n    return {source.expr(program)}\n"
    code = compile(text, f"<boxwood rebuild of {treedef.num_leaves} leaves>", "exec")
    exec(code, source.namespace)
    return source.namespace["build"]


def _merging_unflatten(
    treedef: Any, constants: dict[int, Any]
) -> Callable[[list], Any]:
    n = treedef.num_leaves
    if not constants:

        def unflatten(dyn: list) -> Any:
            # a program may return more (`_jit/_trace.py`): the leading ones
            return treedef.unflatten(dyn[:n])

        return unflatten

    fresh = {i: _copies(v) for i, v in constants.items()}

    def build(dyn: list) -> Any:
        it = iter(dyn)
        return treedef.unflatten(
            [
                (copy.copy(constants[i]) if fresh[i] else constants[i])
                if i in constants
                else next(it)
                for i in range(n)
            ]
        )

    return build
