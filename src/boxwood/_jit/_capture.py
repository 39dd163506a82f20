"""What a `filter_jit` function reads from its closure and globals, treated as input.

`jax.jit` bakes whatever a function reads from its closure cells and globals into
the compiled code at the first trace: rebinding `model` in a notebook cell leaves a
jitted `predict` silently using the old model, and a large captured array is embedded
in the executable as a constant. `filter_jit` instead finds, once, the names a
function reads (`Reads`): its own globals and closure cells, those of the functions
defined inside it (nested code objects), and those of the same-module helper
functions it calls by name (`filter_jit` helpers are inlined). On every call it reads their current values (a generated
function: one dict lookup or cell read and one identity test per name) and

- passes the values that hold arrays (arrays, modules, pytrees with array leaves) to
  the compiled function as one extra, hidden argument: a tuple with one entry per
  watched name (labelled `global 'model'`, `closure 'w'` in messages), `None` for
  the names that hold no arrays (and `None` instead of the tuple when no name holds
  arrays). A tuple of arrays, modules and `None` is what the
  fast paths walk without calling back into Python. The values are traced like
  arguments, so rebinding the name is seen on the next call and a new structure
  retraces;
- leaves every other value (numbers, strings, functions, config objects) to be read
  at trace time, as JAX does, and warns once per name when one has changed since the
  function was traced (`CapturedValueWarning`).

At trace time the function is rebuilt around the traced values: a copy of its globals
with the captured names replaced (helpers are rebuilt on the same copy), and fresh
cells for captured closure variables (`Capture.rebuild`). Names the function assigns
(`global x; x = ...`, `nonlocal n; n += 1`) are its own state, not inputs: they are
not watched, and global assignments made while tracing are written back.

Not followed: attributes of objects (`self.w`, `config.table`), default argument
values, functions from other modules, and names bound to Python modules (`jnp`,
`np`).
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import os
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax

from .._filters import is_array
from .._module import Module
from .._warnings import user_stacklevel
from ._explain import describe_call

_MAX_HELPERS = 32  # helper functions followed per wrapped function
_MISSING = object()  # a name not (yet) bound
_PLAIN = frozenset(
    {int, float, bool, complex, str, bytes, type(None), type, types.FunctionType,
     types.BuiltinFunctionType, types.MethodType, types.ModuleType}
)  # fmt: skip


class CapturedValueWarning(UserWarning):
    """A non-array value read by a `filter_jit` function from its globals or closure
    has changed since the function was traced; the compiled code still uses the old
    value."""


MSG_CHANGED = (
    "{label} changed from {old} to {new} since {name} was compiled; it is baked in "
    "at trace time. Pass it as an argument (or as an array, to trace it), or call "
    "`clear_cache()` on the compiled function to trace again with the new value."
)


# ------------------------------------------------------------------ what is read
def global_label(name: str) -> str:
    return f"global {name!r}"


def closure_label(name: str) -> str:
    return f"closure {name!r}"


def _instructions(code: types.CodeType):
    yield from dis.get_instructions(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # functions defined inside
            yield from _instructions(const)


def _scan_code(code: types.CodeType) -> tuple[list[str], set[str], set[str]]:
    """Global names read, global names assigned, free variables assigned."""
    loads: dict[str, None] = {}
    stores: set[str] = set()
    deref_stores: set[str] = set()
    for ins in _instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            loads[ins.argval] = None
        elif ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            stores.add(ins.argval)
        elif ins.opname in ("STORE_DEREF", "DELETE_DEREF"):
            deref_stores.add(ins.argval)
    return list(loads), stores, deref_stores


class Reads:
    """The names a function reads, found once from its code (see the module doc).

    Followed: `fun`, the functions defined inside it, and helper functions from the
    same module that it reads by name (from its globals or its closure cells),
    transitively, up to `_MAX_HELPERS` functions.

    - `globals`: global names to watch, in first-read order.
    - `cells`: `(label, cell)` of closure cells to watch.
    - `global_helpers`: global names of helpers, rebuilt on the traced globals.
    - `cell_helpers`: ids of cells holding helpers, rebuilt around traced cells.
    - `stored`: global names the followed functions assign.
    """

    def __init__(self, fun: types.FunctionType) -> None:
        g = fun.__globals__
        names: dict[str, None] = {}
        self.stored: set[str] = set()
        self.global_helpers: list[str] = []
        self.cell_helpers: set[int] = set()
        cells: dict[int, tuple[str, types.CellType]] = {}
        stored_cells: set[int] = set()
        functions, seen = [fun], {id(fun)}

        def follow(value: Any) -> bool:
            value = unwrap_jitted(value)
            if (
                type(value) is not types.FunctionType
                or value.__globals__ is not g  # library code is not followed
                or id(value) in seen
            ):
                return False
            if len(functions) >= _MAX_HELPERS:
                return False
            seen.add(id(value))
            functions.append(value)
            return True

        for h in functions:  # grows while it is walked
            loads, stores, deref_stores = _scan_code(h.__code__)
            self.stored |= stores
            for name in loads:
                names[name] = None
                if follow(g.get(name)):
                    self.global_helpers.append(name)
            for name, cell in zip(h.__code__.co_freevars, h.__closure__ or ()):
                if name in deref_stores:
                    stored_cells.add(id(cell))
                if id(cell) in cells:
                    continue
                label = closure_label(name)
                if any(label == other for other, _ in cells.values()):
                    label = closure_label(f"{h.__name__}.{name}")
                cells[id(cell)] = (label, cell)
                if follow(_contents(cell)):
                    self.cell_helpers.add(id(cell))
        self.globals = [n for n in names if _watched_global(g, n, self.stored)]
        self.cells = [
            (label, cell)
            for key, (label, cell) in cells.items()
            if key not in stored_cells
            and label != "closure '__class__'"  # `super()`'s cell in a method
            and not _is_module(_contents(cell))
            and _contents(cell) is not fun  # a recursive inner function
        ]


def unwrap_jitted(value: Any) -> Any:
    """The function inside a `filter_jit` wrapper (it is inlined into the trace of a
    function that calls it, so that the values it captures are traced there too);
    any other value as it is."""
    if hasattr(value, "_boxwood_jit"):
        inner = getattr(value, "__wrapped__", None)
        if type(inner) is types.FunctionType:
            return inner
    return value


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # not assigned yet
        return _MISSING


def _is_module(value: Any) -> bool:
    return isinstance(value, types.ModuleType)


def _watched_global(g: dict, name: str, stored: set[str]) -> bool:
    if name in stored:
        return False
    if name not in g:  # a builtin, or a name defined later
        return not hasattr(builtins, name)
    return not _is_module(g[name])


def has_arrays(value: Any) -> bool:
    """Whether a captured value is an input (it holds arrays) rather than a
    trace-time constant.

    **Arguments:**

    - `value`: what a watched name is bound to.

    **Returns:** `True` for arrays, modules and pytrees with an array leaf.

    >>> import jax.numpy as jnp
    >>> has_arrays({"w": jnp.ones(2), "name": "a"}), has_arrays((0.1, "a"))
    (True, False)
    """
    if type(value) in _PLAIN:
        return False
    if is_array(value) or isinstance(value, Module):  # a module: no walk needed
        return True
    return any(map(is_array, jax.tree_util.tree_leaves(value)))


_METHOD, _PARTIAL = "method", "partial"


def split_callable(value: Any) -> tuple[tuple[str, Any], Any] | None:
    """`((kind, function), part)` for a callable whose data holds arrays: a bound
    method of a module or other pytree (`part`: the object) or a `functools.partial`
    (`part`: `(args, keywords)`). The part is an input, traced like a captured
    module; the function is fixed (part of the cache key). `None` for anything
    else."""
    typ = type(value)
    if typ is types.MethodType:
        obj = value.__self__
        if not isinstance(obj, type) and has_arrays(obj):
            return (_METHOD, value.__func__), obj
    elif typ is functools.partial:
        part = (value.args, value.keywords)
        if has_arrays(part):
            return (_PARTIAL, value.func), part
    return None


def is_input(value: Any) -> bool:
    """Whether a captured value is passed to the compiled code (it holds arrays)."""
    return has_arrays(value) or split_callable(value) is not None


def _join_callable(kind: str, func: Any, part: Any) -> Any:
    if kind == _METHOD:
        return types.MethodType(func, part)
    args, keywords = part
    return functools.partial(func, *args, **keywords)


# ------------------------------------------------------------------ at trace time
def _copy_function(
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

    - `fun`: a plain Python function.
    """

    def __init__(self, fun: types.FunctionType) -> None:
        # weakly: wrappers hold `fun`, and `traced_for` caches by it
        self._fun = weakref.ref(fun)
        self.reads = Reads(fun)
        self.g = fun.__globals__
        self._global = {global_label(n): n for n in self.reads.globals}
        self.labels = [*self._global, *(label for label, _ in self.reads.cells)]
        self.cells = [cell for _, cell in self.reads.cells]
        self._cell_label = {id(cell): label for label, cell in self.reads.cells}
        self.baseline: dict[str, Any] = {}  # label -> value read at the last trace
        self.lock = threading.Lock()
        # Which names hold bound methods or partials, with their functions: each
        # combination is named by a string (`global 'f': partial of loss`), passed
        # as the hidden tuple's last entry: a static part of the cache key, so that
        # another function retraces, and the explanation shows it.
        self._signature_names: dict[tuple, str] = {}
        self._signatures: dict[str, tuple] = {}

    def hidden(self, values: list[Any]) -> tuple | None:
        """The hidden argument for `values` (one per label): the value where it
        holds arrays, else `None`; the data part of a bound method or partial that
        holds arrays, and then the name of their functions as one more entry; or
        `None` itself when no name holds arrays (the argument walk takes it in one
        step, where an all-`None` tuple would cost a tuple walk on every call)."""
        entries: list[Any] = []
        functions = []
        for i, value in enumerate(values):
            split = None if value is _MISSING else split_callable(value)
            if split is not None:
                functions.append((i, *split[0]))
                entries.append(split[1])
            elif value is not _MISSING and has_arrays(value):
                entries.append(value)
            else:
                entries.append(None)
        if functions:
            return (*entries, self._signature_name(tuple(functions)))
        return None if all(e is None for e in entries) else tuple(entries)

    def _signature_name(self, signature: tuple) -> str:
        with self.lock:
            name = self._signature_names.get(signature)
            if name is None:
                name = "; ".join(
                    f"{self.labels[i]}: "
                    f"{'bound method' if kind == _METHOD else 'functools.partial'} of "
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
            entries[i] = _join_callable(kind, func, entries[i])
        return tuple(entries)

    @property
    def empty(self) -> bool:
        """Nothing to watch: the function can be compiled as it is."""
        return not self.labels

    def read(self) -> list[Any]:
        """The current value of every watched name (`_MISSING` where unbound)."""
        g = self.g
        values = [g.get(n, _MISSING) for n in self.reads.globals]
        return values + [_contents(c) for c in self.cells]

    def rebuild(self, hidden: tuple | None) -> types.FunctionType:
        """The function with the values in `hidden` (one per label, `None`: not
        captured; or `None`: nothing captured) substituted for the names they were read from; every other name
        is read as it is now."""
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
            if label not in given
        }
        new_g = dict(g)
        for label, value in given.items():
            if label in self._global:
                new_g[self._global[label]] = value
        rebuilder = _Rebuilder(self, given, new_g)
        for name in self.reads.global_helpers:
            new_g[name] = rebuilder.function(g.get(name))
        return rebuilder.function(fun)

    def write_back(self, traced_globals: dict) -> None:
        """Global assignments made while tracing go to the real globals."""
        for name in self.reads.stored:
            value = traced_globals.get(name, _MISSING)
            if value is not _MISSING and value is not self.g.get(name, _MISSING):
                self.g[name] = value

    def changed(self, values: list[Any], warned: set[str]) -> list[tuple]:
        """`(label, old, new)` for trace-time constants that differ from the traced
        ones (each label once; the labels are added to `warned`)."""
        out = []
        for label, value in zip(self.labels, values):
            if label in warned or label not in self.baseline:
                continue
            old = self.baseline[label]
            if old is value or is_input(value) or _equal(old, value):
                continue
            warned.add(label)
            out.append((label, old, value))
        return out


class _Rebuilder:
    """Copies of the followed functions around the traced values of one trace."""

    def __init__(self, capture: Capture, hidden: dict[str, Any], new_g: dict):
        self.capture, self.hidden, self.new_g = capture, hidden, new_g
        self.cells: dict[int, types.CellType] = {}
        self.functions: dict[int, Any] = {}

    def function(self, h: Any) -> Any:
        h = unwrap_jitted(h)
        if type(h) is not types.FunctionType or h.__globals__ is not self.capture.g:
            return h  # rebound to something else since the scan: used as it is
        new = self.functions.get(id(h))
        if new is None:
            closure = h.__closure__ and tuple(map(self.cell, h.__closure__))
            new = self.functions[id(h)] = _copy_function(h, self.new_g, closure)
        return new

    def cell(self, c: types.CellType) -> types.CellType:
        new = self.cells.get(id(c))
        if new is not None:
            return new
        label = self.capture._cell_label.get(id(c))
        if label in self.hidden:
            new = types.CellType(self.hidden[label])
        elif (
            id(c) in self.capture.reads.cell_helpers
            and type(unwrap_jitted(_contents(c))) is types.FunctionType
        ):
            new = types.CellType()  # before the helper: it may read itself
            self.cells[id(c)] = new
            new.cell_contents = self.function(_contents(c))
        else:
            new = c
        self.cells[id(c)] = new
        return new


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. an ambiguous truth value: treat as changed
        return False


def _short(x: Any, old: Any = _MISSING) -> str:
    """`x` for a message; `old`, when given, is the value `x` replaced: if the two
    print alike (a class or function defined again, as a re-run notebook cell does),
    the text says that `x` is a new object."""
    text = "unbound" if x is _MISSING else repr(x)
    text = text if len(text) <= 60 else text[:57] + "..."
    if old is not _MISSING and x is not _MISSING and _short(old) == text:
        text += " (a new object with the same name: a class or function defined again?)"
    return text


class Traced:
    """`fun` as the compiled core sees it: `(hidden, *args, **kwargs)`, rebuilt
    around the hidden captured values on each trace. It carries `fun`'s name and code
    so that diagnostics about the wrapped function name the user's function."""

    def __init__(self, fun: types.FunctionType, capture: Capture | None) -> None:
        self.capture = capture or Capture(fun)
        self.__code__ = fun.__code__
        self.__name__ = fun.__name__
        self.__qualname__ = fun.__qualname__
        self.__module__ = fun.__module__
        self.__doc__ = fun.__doc__

    @property
    def function(self) -> types.FunctionType | None:
        """The user's function (`None` once it is gone)."""
        return self.capture._fun()

    def __call__(self, hidden: tuple | None, *args: Any, **kwargs: Any) -> Any:
        capture = self.capture
        rebuilt = capture.rebuild(hidden)
        try:
            return rebuilt(*args, **kwargs)
        finally:
            capture.write_back(rebuilt.__globals__)


_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TRACED_LOCK = threading.Lock()


def traced_for(fun: types.FunctionType, variant: Any = None) -> Traced:
    """The `Traced` of `fun` for one calling convention `variant` (its code is
    scanned once; wrappers of the same function with the same convention share
    compiled code, as they do without captures). Held weakly by `fun`: it goes
    when the function does."""
    with _TRACED_LOCK:
        variants = _TRACED.get(fun)
        if variants is None:
            variants = _TRACED[fun] = {}
        traced = variants.get(variant)
        if traced is None:
            first = next(iter(variants.values()), None)
            traced = variants[variant] = Traced(fun, first and first.capture)
        return traced


# ------------------------------------------------------------------ diagnostics
def captured_path(keys: tuple, labels: list[str]) -> str:
    """`global 'model'.layers[0].weight` for the key path below the hidden tuple."""
    index, *rest = keys
    return labels[index.idx] + jax.tree_util.keystr(tuple(rest))


def describe_captures(
    hidden: tuple | None, labels: list[str]
) -> dict[str, tuple[str, str]]:
    """`_explain.describe_call` for the captured values, under their labels."""
    out = {}
    for label, value in zip(labels, hidden or ()):
        if value is not None:
            for path, text in describe_call((value,), {}).items():
                out[label + path.removeprefix("args[0]")] = text
    if hidden is not None and len(hidden) > len(labels):  # bound methods, partials
        out["captured callables"] = ("field", hidden[-1])
    return out


# ------------------------------------------------------------------ per call
# Internal names start with `_bw_` so that they cannot shadow a parameter.
_CALL_TEMPLATE = """
def _bw_make(_bw_g, _bw_cells, _bw_state, _bw_core, _bw_slow):
    {unpack}
    def call({params}):
        _bw_s = _bw_state.snap
        try:
            {reads}
        except (KeyError, ValueError):
            return _bw_slow({args}, {kwargs})
        if {tests}:
            return _bw_slow({args}, {kwargs})
        {forward}
    return call
"""
# `*args, **kwargs` (any signature), or the function's own parameters when it has
# only plain positional ones: no tuple or dict is packed and unpacked on the way
# (about half the layer's cost).
_FORWARD_ANY = """if kwargs:
            return _bw_core(_bw_s[{n}], *args, **kwargs)
        return _bw_core(_bw_s[{n}], *args)"""
_FORWARD_PLAIN = "return _bw_core(_bw_s[{n}], {names})"


def plain_parameters(fun: types.FunctionType) -> list[str] | None:
    """The parameter names of `fun` when they are all positional-or-keyword, with no
    defaults, `*args`, `**kwargs` or keyword-only ones; otherwise `None`."""
    code = fun.__code__
    if (
        code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        or code.co_kwonlyargcount
        or code.co_posonlyargcount
        or fun.__defaults__
    ):
        return None
    names = list(code.co_varnames[: code.co_argcount])
    if any(n.startswith("_bw_") for n in names):
        return None
    return names


class CallState:
    """One wrapper's view of its captures: the last values read, and the names
    already warned about (cleared by `clear_cache`)."""

    __slots__ = ("snap", "warned", "capture")

    def __init__(self, capture: Capture) -> None:
        n = len(capture.labels)
        self.snap: tuple = (_MISSING,) * n + (None,)  # (each name's value..., hidden)
        self.warned: set[str] = set()
        self.capture = capture

    def forget(self) -> None:
        self.warned.clear()

    def hidden_now(self) -> tuple | None:
        """The hidden argument for the names' current values."""
        return self.capture.hidden(self.capture.read())


def make_call(
    capture: Capture,
    core: Callable,
    name: str,
    state: CallState,
    params: list[str] | None = None,
    qualname: str | None = None,
) -> Callable:
    """The per-call function: read the watched names, and call
    `core(hidden, *args, **kwargs)` with those that hold arrays.

    A generated function, so that a warm call costs one lookup and one identity test
    per name (no loop, no tuple of values): when every name is bound to the same
    object as on the previous call, the previous hidden tuple is passed again.
    Otherwise (`slow`) the values are classified again, changed trace-time constants
    are warned about, and a new snapshot replaces the old one in one assignment, so
    that concurrent calls see either snapshot whole.
    """
    n_globals = len(capture.reads.globals)
    n = len(capture.labels)
    globals_ = capture.reads.globals
    reads = [f"_bw_v{i} = _bw_g[{name!r}]" for i, name in enumerate(globals_)]
    reads += [
        f"_bw_v{i + n_globals} = _bw_c{i}.cell_contents"
        for i in range(len(capture.cells))
    ]
    unpack = "".join(f"_bw_c{i}, " for i in range(len(capture.cells)))
    if params is None:
        sig, args, kwargs = "*args, **kwargs", "args", "kwargs"
        forward = _FORWARD_ANY.format(n=n)
    else:
        sig = ", ".join(params)
        args, kwargs = f"({sig}{',' if params else ''})", "{}"
        forward = _FORWARD_PLAIN.format(n=n, names=sig)
    source = _CALL_TEMPLATE.format(
        unpack=f"{unpack} = _bw_cells" if unpack else "pass",
        params=sig,
        reads="\n            ".join(reads),
        args=args,
        kwargs=kwargs,
        tests=" or ".join(f"_bw_v{i} is not _bw_s[{i}]" for i in range(n)),
        forward=forward,
    )
    namespace: dict[str, Any] = {}
    # named inside this package, so that warnings skip the frame (`user_stacklevel`)
    where = os.path.join(os.path.dirname(__file__), f"<captures of {name}>")
    exec(compile(source, where, "exec"), namespace)

    def slow(args: tuple, kwargs: dict) -> Any:
        values = capture.read()
        hidden = capture.hidden(values)
        with capture.lock:
            changed = capture.changed(values, state.warned)
        state.snap = (*values, hidden)
        for label, old, new in changed:
            warnings.warn(
                MSG_CHANGED.format(
                    label=label, old=_short(old), new=_short(new, old), name=name
                ),
                CapturedValueWarning,
                stacklevel=user_stacklevel(),
            )
        return core(hidden, *args, **kwargs)

    call = namespace["_bw_make"](capture.g, capture.cells, state, core, slow)
    # errors about the call's arguments name the user's function
    call.__code__ = call.__code__.replace(co_name=name, co_qualname=qualname or name)
    call.__name__, call.__qualname__ = name, qualname or name
    return call


def wrap(
    fun: Any, variant: Any, make_core: Callable[[Traced], Any]
) -> tuple[Callable, Any, CallState] | None:
    """`filter_jit`'s wrapper for a function that reads values from its closure or
    globals: `(call, core, state)`, where `core = make_core(traced)` compiles
    `traced(hidden, *args, **kwargs)` and `call(*args, **kwargs)` feeds it. `None`
    when `fun` is not a plain Python function or reads nothing that is watched."""
    if type(fun) is not types.FunctionType:
        return None
    traced = traced_for(fun, variant)
    capture = traced.capture
    if capture.empty:
        return None
    core = make_core(traced)
    state = CallState(capture)
    call = make_call(
        capture, core.call, fun.__name__, state, plain_parameters(fun), fun.__qualname__
    )
    if type(capture.g) is dict:
        # with the C extension: the identity tests in C, before the compiled call,
        # with no Python frame in between (`call` takes every call they fail)
        sources, keys = watched_sources(capture)
        fast = core.watching(state, sources, keys, call)
        if fast is not None:
            call = fast
    return call, core, state


def watched_sources(capture: Capture) -> tuple[tuple, tuple]:
    """Where each watched name is read, in the order of `CallState.snap`: the
    globals dict and the name for a global, the cell and `None` for a closure
    variable."""
    names = capture.reads.globals
    sources = (capture.g,) * len(names) + tuple(capture.cells)
    keys = tuple(names) + (None,) * len(capture.cells)
    return sources, keys
