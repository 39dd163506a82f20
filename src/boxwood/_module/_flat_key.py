"""The flat form of modules, kept on the module itself, and the argument walk that
lets `filter_jit` skip flattening.

A module is immutable, so its leaves and structure never change, yet a training loop
flattens the model and the optimiser state it got back from the previous step on
every call. Instead, a module can carry its own flat form in its instance dict, under
`FLAT`: `(token, leaves)`, where the token stands for its treedef. It is attached

- by `filter_jit`'s output builders (`_flat_build.py`) to every module they return
  (the outermost ones), so what one step returns is already flat for the next.
  Those modules are built from the flat form alone: their fields, and the nested
  modules inside, are built when first read (`_field_descriptors.py`), which a
  training loop that passes them straight back never does; and
- by `remember`, to a module argument that `filter_jit` sees a second time.

The record lives and dies with its module (there is no global table), and the
rebuild paths (`treedef.unflatten`, `tree_map`, `tree_at`, pickling and copying,
see `Module.__getstate__`) create new instance dicts without it, so a modified copy
never inherits a stale one.

Only modules whose whole subtree is immutable get a record: every node a boxwood
`Module`, a tuple, a NamedTuple (flattened by jax into its elements) or `None`. A
module holding a list (which could be mutated in place) is always flattened afresh.
Every leaf is a `jax.Array` (a typed PRNG key too) or a hashable non-array value (a function in an ordinary
field, as Equinox code writes `activation: Callable`; a `filter_grad` wrapper's
function; a number): the record's leaves are the arrays alone, and the non-array
leaves, which `filter_jit` treats as static, are part of what the token stands for
(a token per structure *and* those values, told apart as static fields are, so
that `1`, `1.0` and `True` differ). A NumPy array or scalar leaf (dynamic, but not
a `jax.Array`) or an unhashable one means no record.

`walk` turns call arguments into a key (tokens of modules with records, markers for
tuples, lists, dicts and `None`, static scalars by value) and the list of dynamic leaves,
in the order `jax.tree_util.tree_flatten` would give them. `filter_jit` checks that
order against a real flatten before it trusts a key (see `Dispatch.note_fast`).
`call_key` is the key of a whole call, the one definition of the fast path's key.
Each part of a key is prefix-free (a marker, then what the marker says follows), so
the parts of the positional arguments are simply concatenated, and the keywords
follow after `KWARGS_TOKEN` and their sorted names.

`walk`'s tuple and dict branches, and `call_key`'s two loops, each inline arrays and
flat-form modules with the same few lines, written out on purpose: a shared helper
costs a Python call per argument on every warm call.

A write to a module after construction drops the flat forms resting on it, and
only those (`_flat_form.py`); keys stand for structures, never for
arrays, so every key stays valid.
"""

from __future__ import annotations

import threading
import types
import weakref
from math import copysign
from typing import Any, cast

import jax
from jax._src.array import ArrayImpl

from .._filters import is_array
from . import _flat_form
from ._module import Module
from ._register import MODULE_TYPES
from ._static_key import strict

# The concrete `jax.Array` class, named without creating an array: importing
# boxwood must not start JAX's backend.
ARRAY_TYPE: type = ArrayImpl
ARRAY_TOKEN = object()  # stands for "a jax.Array" in a key


# Typed PRNG keys (`jax.random.key`): arrays of their own class, dynamic like any
# array (their implementation is part of their dtype, which JAX's own cache sees).
def _key_array_type() -> type:
    """JAX's class of typed key arrays (private, and it has moved between JAX
    versions); a class nothing is an instance of where it is not found, so keys
    then take the slow path, as any unknown leaf does."""
    import importlib

    for where in ("jax._src.random.prng", "jax._src.prng"):
        try:
            return importlib.import_module(where).PRNGKeyArray
        except (ImportError, AttributeError):
            continue
    return type("_NoKeyArrays", (), {})


KEY_ARRAY_TYPE: type = _key_array_type()
KEY_TOKEN = object()  # stands for "a typed PRNG key array" in a key
# the leaf classes a flat form's arrays may have
_FLAT_ARRAY_TYPES = frozenset({ARRAY_TYPE, KEY_ARRAY_TYPE})
NONE_TOKEN = object()  # stands for `None` (an empty pytree node)
# Leaf types whose values go into a key as they are (hashed by value, as filter_jit
# does for static leaves); their type goes in too, so that `1` and `True` differ.
STATIC_TYPES = frozenset({int, float, bool, str, types.FunctionType})


class _Token:
    """Stands for one module structure (treedef) in keys, and for the values of its
    non-array leaves, if it has any (`statics`: `(leaf index, value)` pairs)."""

    __slots__ = ("treedef", "statics", "__weakref__")

    def __init__(self, treedef: Any, statics: tuple = ()) -> None:
        self.treedef = treedef
        self.statics = statics

    def unflatten(self, arrays: list) -> Any:
        """The module of this structure with these arrays (the record's leaves)."""
        if not self.statics:
            return self.treedef.unflatten(arrays)
        n = self.treedef.num_leaves
        static_idx, values = zip(*self.statics)
        dyn_idx = sorted(set(range(n)).difference(static_idx))
        leaves = merge_leaves(n, dyn_idx, arrays, static_idx, values)
        return self.treedef.unflatten(leaves)


def merge_leaves(n: int, dyn_idx: Any, dyn: Any, static_idx: Any, statics: Any) -> list:
    """The `n` leaves of a tree from its dynamic and static leaves and where each
    goes."""
    leaves: list = [None] * n
    for i, x in zip(dyn_idx, dyn):
        leaves[i] = x
    for i, x in zip(static_idx, statics):
        leaves[i] = x
    return leaves


# treedef (or treedef and static leaves) -> its token, held weakly: a token lives
# as long as something uses it (a module's flat form, a fast-path key, an output
# builder), and the treedef, with the static values inside it, is not kept alive
# after that.
_TOKENS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_TOKENS_LOCK = threading.Lock()


def token_for(treedef: Any, statics: tuple = ()) -> _Token | None:
    """The token of `treedef` whose non-array leaves are `statics` (`(leaf index,
    value)` pairs, none of them `None`). `None` if a value cannot be a key (it is
    unhashable, or comparing it fails)."""
    lookup: Any = treedef
    if statics:
        lookup = (treedef, tuple((i, v, strict(v)) for i, v in statics))
    try:
        token = _TOKENS.get(lookup)
        if token is None:
            with _TOKENS_LOCK:
                token = _TOKENS.get(lookup)
                if token is None:
                    token = _TOKENS[lookup] = _Token(treedef, statics)
    except Exception:  # unhashable, or an `__eq__` that fails: no token
        return None
    return token


def split_leaves(leaves: list) -> tuple[list, tuple] | None:
    """`(arrays, statics)`: a module's `jax.Array` leaves, and its other leaves as
    `(index, value)` pairs (`filter_jit`'s static leaves); `None` if a leaf is an
    array of another kind (NumPy, a tracer), which only a real flatten handles."""
    arrays = []
    statics = []
    for i, x in enumerate(leaves):
        if type(x) in _FLAT_ARRAY_TYPES:
            arrays.append(x)
        elif is_array(x):
            return None
        else:
            statics.append((i, x))
    return arrays, tuple(statics)


def is_module_class(typ: Any) -> bool:
    """A Module class whose instances may carry a flat form: one that does not
    override `__setattr__` (its instances may be changed after construction) and
    keeps every field in the instance dict, where writes are seen (not in a slot
    or behind a property)."""
    return (
        isinstance(typ, type)
        and issubclass(typ, Module)
        and "_boxwood_data" in typ.__dict__
        and typ.__setattr__ is Module.__setattr__
        and len(typ._boxwood_dict_fields) == len(typ._boxwood_field_names)
    )


def immutable(treedef: Any) -> bool:
    """Whether every node of `treedef` is a Module, tuple, NamedTuple or None (a
    loop, not a recursion: modules may nest deeper than Python's recursion limit)."""
    stack = [treedef]
    while stack:
        td = stack.pop()
        if td.num_nodes == 1 and td.num_leaves == 1:
            continue
        typ, _ = td.node_data()
        ok = (
            typ is type(None)
            or is_module_class(typ)
            # tuples, and NamedTuples that jax flattens into their elements; not a
            # tuple subclass with its own flatten (which may read mutable state)
            or (isinstance(typ, type) and issubclass(typ, tuple) and _walkable(typ))
        )
        if not ok:
            return False
        stack.extend(td.children())
    return True


def remember(obj: Module) -> tuple | None:
    """Flatten `obj` and attach its flat form, if it is eligible (see the module
    docstring). **Returns** the record `(token, arrays)` or `None`."""
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    split = split_leaves(leaves) if leaves else None
    if split is None or not immutable(treedef):
        return None
    arrays, statics = split
    token = token_for(treedef, statics)
    if token is None:
        return None
    record = (token, arrays)
    _flat_form.attach(obj, record)  # (noted on the modules inside)
    return record


def _module_statics(obj: Module, record: tuple, statics: list) -> None:
    """Append the static leaves of `obj` (which carries `record`) to `statics`, in
    flatten order: `obj`'s own objects (the token may have been made by an equal
    module)."""
    if record[0].statics:
        statics.extend(
            x
            for x in jax.tree_util.tree_leaves(obj)
            if type(x) not in _FLAT_ARRAY_TYPES
        )


# NamedTuple classes (and other tuple subclasses): True where jax flattens an
# instance natively into its elements in order, so that `walk` may walk it.
WALKABLE: dict[type, bool] = {tuple: True, list: True}


def _walkable(typ: type) -> bool:
    ok = WALKABLE.get(typ)
    if ok is None:
        ok = False
        if issubclass(typ, tuple) and hasattr(typ, "_fields"):
            named: Any = typ  # a NamedTuple class
            probe = tuple.__new__(typ, [object() for _ in named._fields])
            try:
                leaves, treedef = jax.tree_util.tree_flatten(probe)
                ok = treedef.node_data()[0] is typ and all(
                    a is b for a, b in zip(leaves, probe, strict=True)
                )
            except Exception:  # a custom registration that rejects the probe
                ok = False
        WALKABLE[typ] = ok
    return ok


def walk(obj: Any, key: list, dyn: list) -> bool:
    """Append `obj`'s part of a key to `key` and its dynamic leaves to `dyn`;
    `False` (leaving both partly filled) where only a real flatten will do: a module
    without a flat form, a dict whose keys don't sort, a custom pytree node, an
    array that is neither a `jax.Array` nor a typed PRNG key (NumPy, a tracer)."""
    typ = type(obj)
    if typ is ARRAY_TYPE or typ is KEY_ARRAY_TYPE:
        key.append(ARRAY_TOKEN if typ is ARRAY_TYPE else KEY_TOKEN)
        dyn.append(obj)
        return True
    if typ in MODULE_TYPES:
        record = obj._boxwood_flat
        if record is None:
            return False
        key.append(record[0])
        dyn += record[1]
        return True
    if WALKABLE.get(typ) or (isinstance(obj, tuple) and _walkable(typ)):
        key.append(typ)
        key.append(len(obj))
        for child in obj:  # arrays and modules inline: most children are those
            t = type(child)
            if t is ARRAY_TYPE:
                key.append(ARRAY_TOKEN)
                dyn.append(child)
            elif t in MODULE_TYPES and (record := child._boxwood_flat) is not None:
                key.append(record[0])
                dyn += record[1]
            elif not walk(child, key, dyn):
                return False
        return True
    if obj is None:
        key.append(NONE_TOKEN)
        return True
    if typ in STATIC_TYPES:
        key.append(typ)
        key.append(obj)
        if typ is float:  # `-0.0 == 0.0`: the sign tells them apart
            key.append(copysign(1.0, cast(float, obj)))
        return True
    if typ is dict:  # keyword arguments too: values inline, as for tuples
        order = _dict_order(cast(dict, obj))
        if order is None:
            return False
        key.append(dict)
        key.append(order)
        for k in order:
            child = obj[k]
            t = type(child)
            if t is ARRAY_TYPE:
                key.append(ARRAY_TOKEN)
                dyn.append(child)
            elif t in MODULE_TYPES and (record := child._boxwood_flat) is not None:
                key.append(record[0])
                dyn += record[1]
            elif not walk(child, key, dyn):
                return False
        return True
    return False


KWARGS_TOKEN = object()  # the keyword arguments follow (their sorted names first)


def call_key(args: tuple, kwargs: dict, dyn: list) -> tuple | None:
    """The fast path's key of a call, with the call's dynamic leaves appended to
    `dyn` in flatten order: the parts of the positional arguments, then, if there
    are keyword arguments, `KWARGS_TOKEN`, their sorted names and the parts of
    their values in that order; `None` where a real flatten is needed."""
    key: list = []
    # The array and flat-form-module cases are written inline here, for the
    # positional and the keyword loop, as in `walk`'s dict case: this runs on every
    # warm call, and a helper call per argument costs more than the whole test.
    for a in args:  # arrays and flat-form modules inline: most arguments are those
        t = type(a)
        if t is ARRAY_TYPE:
            key.append(ARRAY_TOKEN)
            dyn.append(a)
        elif t in MODULE_TYPES and (record := a._boxwood_flat) is not None:
            key.append(record[0])
            dyn += record[1]
        elif not walk(a, key, dyn):
            return None
    if kwargs:
        order = _ORDERS.get(tuple(kwargs))  # (the names are strings: hashable)
        if order is None and (order := _dict_order(kwargs)) is None:
            return None
        key.append(KWARGS_TOKEN)
        key.append(order)
        for name in order:
            a = kwargs[name]
            t = type(a)
            if t is ARRAY_TYPE:
                key.append(ARRAY_TOKEN)
                dyn.append(a)
            elif t in MODULE_TYPES and (record := a._boxwood_flat) is not None:
                key.append(record[0])
                dyn += record[1]
            elif not walk(a, key, dyn):
                return None
    return tuple(key)


# A dict's keys in insertion order -> the same keys sorted, as jax flattens dicts
# (a tuple of the keys is cheaper to look up here than to sort on every call).
_ORDERS: dict[tuple, tuple] = {}
_MAX_ORDERS = 1024


def _dict_order(obj: dict) -> tuple | None:
    keys = tuple(obj)
    try:
        order = _ORDERS.get(keys)
    except TypeError:  # unhashable keys
        return None
    if order is None:
        try:
            order = tuple(sorted(keys))
        except TypeError:  # keys that don't sort: leave them to jax
            return None
        if len(_ORDERS) < _MAX_ORDERS:
            _ORDERS[keys] = order
    return order


def remember_walkable(obj: Any, statics: list, seen: set, now: set) -> Any:
    """Prepare `obj` for `walk` on the slow path: give its modules their flat form
    (a module seen by the previous slow call, its id in `seen`; a module seen for
    the first time has its id added to `now` instead) and collect its static leaves
    in `statics`, in flatten order.

    **Returns** `True`, `None` ("not yet": a module was seen for the first time), or
    `False` (a module here can never carry a flat form).
    """
    typ = type(obj)
    if typ in MODULE_TYPES:
        record = obj._boxwood_flat
        if record is None:
            if id(obj) not in seen:
                now.add(id(obj))
                return None
            record = remember(obj)
            if record is None:
                return False
        _module_statics(obj, record, statics)
        return True
    if typ is dict:
        order = _dict_order(obj)
        children = [obj[k] for k in order] if order is not None else ()
    elif isinstance(obj, (tuple, list)) and _walkable(typ):
        children = obj
    else:
        if typ in STATIC_TYPES:
            statics.append(obj)
        return True  # a leaf, or something `walk` will turn down
    result: Any = True
    for child in children:
        step = remember_walkable(child, statics, seen, now)
        if step is False:
            return False
        if step is None:
            result = None
    return result
