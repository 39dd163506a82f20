"""At trace time: the function copied around the traced values of its captures.

A copy of the function's globals with the captured names replaced by the traced
values, copies of the followed functions on those globals (`Rebuilder.value`: a
function, a wrapper holding one in its closure or in a field, a partial, a bound
method, a dict, list or tuple of those), and fresh cells for captured closure
variables."""

from __future__ import annotations

import functools
import itertools
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax

from ..._module import BoundMethod, Module, bind_method
from ._reads import MAX_DEPTH, Reads, unwrap_jitted
from ._values import (
    METHOD,
    MISSING,
    Same,
    contents,
    describe_value,
    foreign_label,
    global_label,
    has_arrays,
    join_callable,
    split_callable,
    value_key,
)  # fmt: skip

_CONTAINERS = (dict, list, tuple)
_NAMES = itertools.count(1)  # static names are never reused in a process
_MAX_STATICS = 256  # static names kept per capture (then it starts over)
_UNBOUND = ("unbound",)  # the key of a name not bound (yet)
_MAX_DESCRIBED = 4096
# static name -> `{label: text}` of its constants, for `traced.describe_captures`
DESCRIBED: dict[str, dict[str, str]] = {}
_DESCRIBED_LOCK = threading.Lock()


def describe(name: str, texts: dict[str, str]) -> None:
    with _DESCRIBED_LOCK:
        DESCRIBED[name] = texts
        while len(DESCRIBED) > _MAX_DESCRIBED:  # the oldest first
            DESCRIBED.pop(next(iter(DESCRIBED)), None)


def _key(value: Any) -> Any:
    try:
        return value_key(value)
    except Exception:  # an object that breaks the walk (a tuple subclass...)
        return Same(value)


def copy_function(
    fun: types.FunctionType,
    g: dict,
    closure: tuple | None,
    value: Callable[[Any], Any] | None = None,
) -> types.FunctionType:
    """`fun` with globals `g` and `closure`; its default values are passed
    through `value` where given (a default holding a followed function)."""
    positional, keywords = fun.__defaults__, fun.__kwdefaults__
    if value is not None and positional:
        positional = tuple(value(d) for d in positional)
    if value is not None and keywords:
        keywords = {name: value(d) for name, d in keywords.items()}
    new = types.FunctionType(fun.__code__, g, fun.__name__, positional, closure)
    new.__kwdefaults__ = keywords
    new.__qualname__ = fun.__qualname__
    new.__dict__.update(fun.__dict__)
    return new


def inlined_wrapper(wrapper: Any, function: types.FunctionType) -> types.FunctionType:
    """A `filter_jit` wrapper as the trace of a function that reads it sees it:
    `function` (the wrapper's function, rebuilt for this trace), run inline, as a
    copy of its own that carries the wrapper's attributes (`cache_info`, `lower`,
    its name) with `__wrapped__` naming `function`, as the wrapper's names its
    function outside a trace (`step.__wrapped__(x)` runs as under Equinox). The
    copy is new, so nothing is set on the user's function."""
    copy = copy_function(function, function.__globals__, function.__closure__)
    copy.__dict__.update(getattr(wrapper, "__dict__", {}))
    copy.__wrapped__ = function  # type: ignore[attr-defined]
    return copy


class Labels(list):
    """The labels of a capture's names (`global 'LR'`, `closure 'w'`), in the
    order of the hidden argument's entries; `first`: `{label: text}` of the
    constants that a hidden argument without a static name stands for."""

    first: dict[str, str] = {}


class Capture:
    """The captured names of one function and how to rebuild it around new values.

    **Arguments:**

    - `fun`: a plain Python function, or a callable object whose functions are
      scanned for names to warn about only (`warn_only`: nothing is rebuilt).
    - `g`: the globals the names are read from.
    - `own`: the capture belongs to one wrapper only (a callable object's,
      made when its module arguments turn out to read globals), so that its
      first constants may stand for themselves, as a plain function's do.
    """

    def __init__(self, fun: Any, g: dict | None = None, own: bool = False) -> None:
        # weakly: wrappers hold `fun`, and `traced_for` caches by it
        plain = type(fun) is types.FunctionType
        self._fun = weakref.ref(fun) if plain else (lambda: None)
        if plain:
            g = fun.__globals__
        assert g is not None, "a callable object is scanned in the globals given"
        self.g: dict = g
        self.reads = Reads(fun, self.g)
        self._global = {global_label(n): n for n in self.reads.globals}
        self.labels = Labels([*self._global, *(label for label, _ in self.reads.cells)])
        # The first combination of constants a function's capture keys stands for
        # itself (no static name): a program that never rebinds a name passes the
        # hidden argument it passed before constants were keyed (`None` when no
        # name holds arrays). Only for a plain function (its capture is the one
        # all its wrappers share, `traced.traced_for`) or a capture of one
        # wrapper's own (`own`), so that `None` means one thing.
        self._none_first = plain or own
        self.cells = [cell for _, cell in self.reads.cells]
        self._cell_label = {id(cell): label for label, cell in self.reads.cells}
        self.warn_only = {global_label(n) for n in self.reads.warn_only}
        self.unfollowed = {global_label(n): f for n, f in self.reads.unfollowed.items()}
        self.layers: weakref.WeakSet = weakref.WeakSet()  # the per-call layers
        self.lock = threading.Lock()
        # watched for module arguments (`extend`)
        self.extra: dict[tuple[int, str], tuple[dict, str]] = {}
        # Globals of other files (those of module arguments' classes) read inside
        # methods: `(globals, name)`, after the closure cells in `labels`.
        self.foreign: list[tuple[dict, str]] = []
        # The static names (see `hidden`): the keys of the trace-time constants and
        # the functions of bound methods and partials -> the name; the name -> those
        # functions; `(label, text)` -> the keys whose text reads so (numbered).
        self._statics: dict[tuple, str | None] = {}
        self._signatures: dict[str, tuple] = {}
        self._texts: dict[tuple[str, str], list] = {}

    def extend(self, extra: dict[tuple[int, str], tuple[dict, str]]) -> bool:
        """Watch the globals in `extra` too (`{(id(globals), name): (globals,
        method qualname)}`: read inside methods of module arguments, found at a
        call, in this function's globals or another file's), as trace-time
        constants of those methods; `True` when a name is new (the per-call checks
        must then read it: `layer.Layer.rewatch`)."""
        with self.lock:
            new = {
                key: (g, method)
                for key, (g, method) in extra.items()
                if key not in self.extra
                and (g is not self.g or key[1] not in self.reads.stored)
            }
            if not new:
                return False
            self.extra.update(new)
            return self._add(new)

    def _add(self, extra: dict[tuple[int, str], tuple[dict, str]]) -> bool:
        """Watch these; `True` when a label is new."""
        before = len(self.labels)
        for (_, name), (g, method) in extra.items():
            if g is self.g:
                label = global_label(name)
                if label not in self._global:
                    self.reads.globals.append(name)
                    self._global[label] = name
                    self.warn_only.add(label)
            else:
                label = foreign_label(g, name)
                if label not in self.warn_only:
                    self.foreign.append((g, name))
                    self.warn_only.add(label)
            self.unfollowed.setdefault(label, method)
        self.labels[:] = [
            *self._global,
            *(label for label, _ in self.reads.cells),
            *(foreign_label(g, n) for g, n in self.foreign),
        ]
        return len(self.labels) != before

    def adopt(self, other: Capture) -> bool:
        """Take the names of a new scan of the same function (`other`); `True` when
        the watched names changed (the per-call check must then read the new ones:
        `layer.Layer.rewatch`). `labels` is updated in place: the compiled core
        holds that list to name the hidden argument's entries in messages."""
        other._add(self.extra)
        other.extra = self.extra
        with self.lock:
            moved = other.labels != self.labels or other.warn_only != self.warn_only
            self.reads, self._global = other.reads, other._global
            self.labels[:] = other.labels
            self.cells, self._cell_label = other.cells, other._cell_label
            self.foreign = other.foreign
            self.warn_only, self.unfollowed = other.warn_only, other.unfollowed
            if moved:
                self.labels.first = {}
                self._statics.clear()
                self._signatures.clear()
                self._texts.clear()
            return moved

    def hidden(self, values: list[Any]) -> Any:
        """The hidden argument for `values` (one per label).

        Entries: the value where it holds arrays (an input), the data part of a
        bound method or partial that holds arrays, else `None`. Every other value
        (a number, a string, a function, a class, an optax transformation, ...),
        and every value read inside a method, is a trace-time constant: its key
        (`values.value_key`) goes into one string, the *static name*, which ends
        the tuple and is a static leaf, so that a rebinding to another value
        retraces with it, and rebinding it back finds the code traced for it.
        With no input at all the static name alone is the hidden argument (or
        `None` when there is nothing to key): the argument walk takes it in one
        step, where a tuple of `None`s would cost a tuple walk on every call."""
        entries: list[Any] = []
        functions = []
        keys = []
        for i, (label, value) in enumerate(zip(self.labels, values)):
            if value is not MISSING and label not in self.warn_only:
                split = split_callable(value)
                if split is not None:
                    functions.append((len(entries), *split[0]))
                    entries.append(split[1])
                    continue
                if has_arrays(value):
                    entries.append(value)
                    if label in self.unfollowed:  # a method reads it too
                        keys.append((i, Same(value)))
                    continue
            entries.append(None)
            keys.append((i, _UNBOUND if value is MISSING else _key(value)))
        static = (
            self._static_name(tuple(functions), tuple(keys), values)
            if functions or keys
            else None
        )
        if all(e is None for e in entries):
            return static
        return tuple(entries) if static is None else (*entries, static)

    def _static_name(
        self, functions: tuple, keys: tuple, values: list[Any]
    ) -> str | None:
        """The static name of these functions (of bound methods and partials) and
        keys of constants: one per distinct combination (and capture), never
        reused for another in the process, so that wrappers sharing compiled code
        never confuse two; `None` for the first combination of constants alone of
        a plain function (see `_none_first`), described in `labels.first`."""
        key = (functions, keys)
        with self.lock:
            if key in self._statics:
                return self._statics[key]
            if len(self._statics) >= _MAX_STATICS:  # a long session: start over
                self._statics.clear()
            texts = self._describe(functions, keys, values)
            if self._none_first and not functions:
                self._none_first = False  # never again: `None` is this one
                self._statics[key] = None
                self.labels.first = texts
                return None
            name = f"captured values #{next(_NAMES)}"
            self._statics[key] = name
            if functions:
                self._signatures[name] = functions
            describe(name, texts)
            return name

    def _describe(self, functions: tuple, keys: tuple, values: list[Any]) -> dict:
        """`{label: text}` of the constants in a static name, for explanations."""
        out = {}
        for i, key in keys:
            label, value = self.labels[i], values[i]
            if type(key) is Same and label not in self.warn_only:
                label += f" (read inside `{self.unfollowed.get(label, '?')}`)"
            if value is MISSING:
                out[label] = "unbound"
                continue
            seen = self._texts.setdefault((label, describe_value(value, 1)), [])
            if key not in seen:
                seen.append(key)
            out[label] = describe_value(value, seen.index(key) + 1)
        if functions:
            out["captured callables"] = "; ".join(
                f"{self.labels[i]}: "
                f"{'bound method' if kind == METHOD else 'functools.partial'} of "
                f"{getattr(func, '__qualname__', type(func).__name__)}"
                for i, kind, func in functions
            )
        return out

    def _joined(self, hidden: Any) -> tuple:
        """The entries of `hidden` with bound methods and partials put back
        together (empty when no name holds arrays)."""
        if hidden is None or type(hidden) is str:
            return ()
        if len(hidden) == len(self.labels):
            return tuple(hidden)
        entries = list(hidden[:-1])
        for i, kind, func in self._signatures.get(hidden[-1], ()):
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
        values += [contents(c) for c in self.cells]
        return values + [f.get(n, MISSING) for f, n in self.foreign]

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
        if depth > MAX_DEPTH or v is None or v is MISSING:
            return v
        key = id(v)
        if key in self.done:
            return self.done[key]
        self._keep.append(v)
        self.done[key] = v  # a cycle sees the original
        inner = unwrap_jitted(v)
        new = self._value(inner, depth)
        if inner is not v:
            new = inlined_wrapper(v, new)
        self.done[key] = new
        return new

    def _value(self, v: Any, depth: int) -> Any:
        typ = type(v)
        if typ is types.FunctionType:
            if v.__globals__ is self.capture.g:
                closure = v.__closure__ and tuple(map(self.cell, v.__closure__))
                default = lambda d: self.value(d, depth + 1)
                return copy_function(v, self.new_g, closure, default)
            if not v.__closure__:
                return v
            closure = tuple(self.cell(c, depth + 1) for c in v.__closure__)
            if all(a is b for a, b in zip(closure, v.__closure__)):
                return v
            return copy_function(v, v.__globals__, closure)  # a wrapper from elsewhere
        if typ is functools.partial:
            func = self.value(v.func, depth + 1)
            args = [self.value(a, depth + 1) for a in v.args]
            keywords = {k: self.value(a, depth + 1) for k, a in v.keywords.items()}
            same = all(a is b for a, b in zip(args, v.args)) and all(
                keywords[k] is a for k, a in v.keywords.items()
            )
            if func is v.func and same:
                return v
            return functools.partial(func, *args, **keywords)
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
