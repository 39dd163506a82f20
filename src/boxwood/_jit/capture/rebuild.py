"""At trace time: the function copied around the traced values of its captures.

A copy of the function's globals with the captured names replaced by the traced
values, copies of the followed functions on those globals (`Rebuilder.value`: a
function, a wrapper holding one in its closure or in a field, a partial, a bound
method, a dict, list or tuple of those), and fresh cells for captured closure
variables."""

from __future__ import annotations

import functools
import threading
import types
import weakref
from typing import Any

import jax

from ..._module import BoundMethod, Module, bind_method
from .reads import Reads, unwrap_jitted
from .values import (
    METHOD,
    MISSING,
    contents,
    equal,
    global_label,
    has_arrays,
    is_input,
    join_callable,
    split_callable,
)  # fmt: skip

_CONTAINERS = (dict, list, tuple)


def copy_function(
    fun: types.FunctionType, g: dict, closure: tuple | None
) -> types.FunctionType:
    new = types.FunctionType(fun.__code__, g, fun.__name__, fun.__defaults__, closure)
    new.__kwdefaults__ = fun.__kwdefaults__
    new.__qualname__ = fun.__qualname__
    new.__dict__.update(fun.__dict__)
    return new


class Capture:
    """The captured names of one function and how to rebuild it around new values.

    **Arguments:**

    - `fun`: a plain Python function, or a callable object whose functions are
      scanned for names to warn about only (`warn_only`: nothing is rebuilt).
    - `g`: the globals the names are read from.
    """

    def __init__(self, fun: Any, g: dict | None = None) -> None:
        # weakly: wrappers hold `fun`, and `traced_for` caches by it
        plain = type(fun) is types.FunctionType
        self._fun = weakref.ref(fun) if plain else (lambda: None)
        if plain:
            g = fun.__globals__
        assert g is not None, "a callable object is scanned in the globals given"
        self.g: dict = g
        self.reads = Reads(fun, self.g)
        self._global = {global_label(n): n for n in self.reads.globals}
        self.labels = [*self._global, *(label for label, _ in self.reads.cells)]
        self.cells = [cell for _, cell in self.reads.cells]
        self._cell_label = {id(cell): label for label, cell in self.reads.cells}
        self.warn_only = {global_label(n) for n in self.reads.warn_only}
        self.unfollowed = {global_label(n): f for n, f in self.reads.unfollowed.items()}
        self.baseline: dict[str, Any] = {}  # label -> value read at the last trace
        self.layers: weakref.WeakSet = weakref.WeakSet()  # the per-call layers
        self.lock = threading.Lock()
        # Which names hold bound methods or partials, with their functions: each
        # combination is named by a string (`global 'f': partial of loss`), passed
        # as the hidden tuple's last entry: a static part of the cache key, so that
        # another function retraces, and the explanation shows it.
        self._signature_names: dict[tuple, str] = {}
        self._signatures: dict[str, tuple] = {}

    def adopt(self, other: Capture) -> bool:
        """Take the names of a new scan of the same function (`other`); `True` when
        the watched names changed (the per-call check must then read the new ones:
        `layer.Layer.rewatch`). `labels` is updated in place: the compiled core
        holds that list to name the hidden argument's entries in messages."""
        with self.lock:
            moved = other.labels != self.labels or other.warn_only != self.warn_only
            self.reads, self._global = other.reads, other._global
            self.labels[:] = other.labels
            self.cells, self._cell_label = other.cells, other._cell_label
            self.warn_only, self.unfollowed = other.warn_only, other.unfollowed
            if moved:
                self.baseline = {}
                self._signature_names.clear()
                self._signatures.clear()
            return moved

    def hidden(self, values: list[Any]) -> tuple | None:
        """The hidden argument for `values` (one per label): the value where it
        holds arrays, else `None`; the data part of a bound method or partial that
        holds arrays, and then the name of their functions as one more entry; or
        `None` itself when no name holds arrays (the argument walk takes it in one
        step, where an all-`None` tuple would cost a tuple walk on every call)."""
        entries: list[Any] = []
        functions = []
        for label, value in zip(self.labels, values):
            if value is MISSING or label in self.warn_only:
                entries.append(None)
                continue
            split = split_callable(value)
            if split is not None:
                functions.append((len(entries), *split[0]))
                entries.append(split[1])
            else:
                entries.append(value if has_arrays(value) else None)
        if functions:
            return (*entries, self._signature_name(tuple(functions)))
        return None if all(e is None for e in entries) else tuple(entries)

    def _signature_name(self, signature: tuple) -> str:
        with self.lock:
            name = self._signature_names.get(signature)
            if name is None:
                name = "; ".join(
                    f"{self.labels[i]}: "
                    f"{'bound method' if kind == METHOD else 'functools.partial'} of "
                    f"{getattr(func, '__qualname__', type(func).__name__)}"
                    for i, kind, func in signature
                )
                if name in self._signatures:  # same names, other functions
                    name += f" (#{len(self._signatures)})"
                self._signature_names[signature] = name
                self._signatures[name] = signature
            return name

    def _joined(self, hidden: tuple | None) -> tuple:
        """`hidden` with bound methods and partials put back together."""
        if hidden is None:
            return ()
        if len(hidden) == len(self.labels):
            return tuple(hidden)
        entries = list(hidden[:-1])
        for i, kind, func in self._signatures[hidden[-1]]:
            entries[i] = join_callable(kind, func, entries[i])
        return tuple(entries)

    @property
    def empty(self) -> bool:
        """Nothing to watch: the function can be compiled as it is."""
        return not self.labels

    def read(self) -> list[Any]:
        """The current value of every watched name (`MISSING` where unbound)."""
        g = self.g
        values = [g.get(n, MISSING) for n in self.reads.globals]
        return values + [contents(c) for c in self.cells]

    def rebuild(self, hidden: tuple | None) -> types.FunctionType:
        """The function with the values in `hidden` (one per label, `None`: not
        captured; or `None`: nothing captured) substituted for the names they were
        read from; every other name is read as it is now."""
        fun, g = self._fun(), self.g
        assert fun is not None, "the wrappers of a function hold it"
        given = {
            label: value
            for label, value in zip(self.labels, self._joined(hidden))
            if value is not None
        }
        self.baseline = {
            label: value
            for label, value in zip(self.labels, self.read())
            if label not in given or label in self.unfollowed
        }
        new_g = dict(g)
        rebuilder = Rebuilder(self, given, new_g)
        for label, value in given.items():
            if label in self._global:
                new_g[self._global[label]] = rebuilder.value(value)
        for name in self.reads.global_helpers:
            if global_label(name) not in given:
                new_g[name] = rebuilder.value(g.get(name))
        return rebuilder.value(fun)

    def write_back(self, traced_globals: dict) -> None:
        """Global assignments made while tracing go to the real globals."""
        for name in self.reads.stored:
            value = traced_globals.get(name, MISSING)
            if value is not MISSING and value is not self.g.get(name, MISSING):
                self.g[name] = value

    def changed(self, values: list[Any], warned: set[str]) -> list[tuple]:
        """`(label, old, new)` for trace-time constants that differ from the traced
        ones, and for values read inside methods (`unfollowed`) that changed (each
        label once; the labels are added to `warned`)."""
        out = []
        for label, value in zip(self.labels, values):
            if label in warned or label not in self.baseline:
                continue
            old = self.baseline[label]
            if old is value or equal(old, value):
                continue
            if label not in self.unfollowed and is_input(value):
                continue
            warned.add(label)
            out.append((label, old, value))
        return out


class Rebuilder:
    """Copies of the followed functions around the traced values of one trace."""

    def __init__(self, capture: Capture, hidden: dict[str, Any], new_g: dict):
        self.capture, self.hidden, self.new_g = capture, hidden, new_g
        self.cells: dict[int, types.CellType] = {}
        self.done: dict[int, Any] = {}
        self._keep: list[Any] = []  # the originals, so that their ids stay theirs

    def value(self, v: Any, depth: int = 0) -> Any:
        """`v` with the followed functions inside it replaced by their copies (`v`
        itself when it holds none)."""
        if depth > 6 or v is None or v is MISSING:
            return v
        key = id(v)
        if key in self.done:
            return self.done[key]
        self._keep.append(v)
        self.done[key] = v  # a cycle sees the original
        new = self._value(unwrap_jitted(v), depth)
        self.done[key] = new
        return new

    def _value(self, v: Any, depth: int) -> Any:
        typ = type(v)
        if typ is types.FunctionType:
            if v.__globals__ is self.capture.g:
                closure = v.__closure__ and tuple(map(self.cell, v.__closure__))
                return copy_function(v, self.new_g, closure)
            if not v.__closure__:
                return v
            closure = tuple(self.cell(c, depth + 1) for c in v.__closure__)
            if all(a is b for a, b in zip(closure, v.__closure__)):
                return v
            return copy_function(v, v.__globals__, closure)  # a wrapper from elsewhere
        if typ is functools.partial:
            func = self.value(v.func, depth + 1)
            return (
                v if func is v.func else functools.partial(func, *v.args, **v.keywords)
            )
        if typ is types.MethodType:
            func = self.value(v.__func__, depth + 1)
            return v if func is v.__func__ else types.MethodType(func, v.__self__)
        if typ is BoundMethod:
            func = self.value(v.func, depth + 1)
            return v if func is v.func else bind_method(func, v.instance)
        if typ in _CONTAINERS:
            items = list(v.items()) if typ is dict else list(enumerate(v))
            new = [(k, self.value(x, depth + 1)) for k, x in items]
            if all(a is b for (_, a), (_, b) in zip(new, items)):
                return v
            return dict(new) if typ is dict else typ(x for _, x in new)
        if isinstance(v, Module):  # a transform's wrapper: its function is a leaf
            leaves, treedef = jax.tree_util.tree_flatten(v)
            new = [self.value(x, depth + 1) if callable(x) else x for x in leaves]
            if all(a is b for a, b in zip(new, leaves)):
                return v
            return jax.tree_util.tree_unflatten(treedef, new)
        return v

    def cell(self, c: types.CellType, depth: int = 0) -> types.CellType:
        new = self.cells.get(id(c))
        if new is not None:
            return new
        label = self.capture._cell_label.get(id(c))
        if label in self.hidden:
            new = types.CellType(self.value(self.hidden[label]))
            self.cells[id(c)] = new
            return new
        old = contents(c)
        if old is MISSING or not callable(old) and type(old) not in _CONTAINERS:
            self.cells[id(c)] = c
            return c
        new = types.CellType()  # before the helper: it may read itself
        self.cells[id(c)] = new
        value = self.value(old, depth)
        if value is old:
            self.cells[id(c)] = c
            return c
        new.cell_contents = value
        return new
