"""The names a function reads, found from its code and the functions it reaches.

`Reads(fun)` scans `fun`'s bytecode, the functions defined inside it, and every
function of the same module it reaches from a name it reads: a function, a
`filter_jit`, `filter_grad`, `filter_value_and_grad` or `filter_vmap` wrapper, a
function wrapper that keeps the function in its closure (`jax.vmap`, `jax.grad`,
`functools.wraps` decorators), a `functools.partial` (its function and the
functions among its arguments), a bound method, or a dict, list or tuple of
those, named or held as a parameter's default value
(`def f(x, helper=helper)`). These are *followed*: at trace time they are copied
around the traced values (`_rebuild.py`), so what they read is an input.

Methods and class attributes (`model(x)` runs `type(model).__call__`, `C.helper`
a static method) are found too, but they cannot be copied in place: what they
read from globals is fixed at the first trace. The names of those that hold
arrays are watched all the same (`unfollowed`), so that rebinding one warns
instead of giving a silently stale result.
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import itertools
import types
import weakref
from collections.abc import Iterator
from typing import Any

from ..._module import BoundMethod, Module
from ._values import MISSING, closure_label, contents

MAX_FUNCTIONS = 64  # functions scanned per wrapped function
# wrappers and containers looked through from one value, here and when the
# followed functions are copied (`_rebuild.Rebuilder`): `jax.grad(f)` keeps `f`
# four closures deep, and a `partial` or another transform adds to that
MAX_DEPTH = 8
_MAX_ITEMS = 64  # items of one container looked at
_MAX_VISITS = 512  # values looked at from one name
_CONTAINERS = (dict, list, tuple)


def unwrap_jitted(value: Any) -> Any:
    """The function inside a `filter_jit` wrapper (it is inlined into the trace of a
    function that calls it, so that the values it captures are traced there too);
    any other value as it is."""
    if hasattr(value, "_boxwood_jit"):
        inner = getattr(value, "__wrapped__", None)
        if type(inner) is types.FunctionType:
            return inner
    return value


def _instructions(code: types.CodeType):
    yield from dis.get_instructions(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # functions defined inside
            yield from _instructions(const)


def scan_code(code: types.CodeType) -> tuple[list[str], set[str], set[str]]:
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


def _own_class(cls: type, g: dict) -> bool:
    return getattr(cls, "__module__", None) == g.get("__name__", MISSING)


def class_functions(cls: type, g: dict) -> Iterator[Any]:
    for klass in cls.__mro__:
        if _own_class(klass, g):
            for name, item in vars(klass).items():
                # construction and other protocol methods do not run in a call
                if not name.startswith("__") or name == "__call__":
                    yield unbound(item, klass)


def unbound(item: Any, klass: type) -> Any:
    """A class attribute as reading it on the class gives it (a static method, a
    module's method: the function), a property as its getter."""
    if isinstance(item, property):
        return item.fget
    if type(item) is types.FunctionType or not hasattr(type(item), "__get__"):
        return item
    try:
        return item.__get__(None, klass)
    except Exception:  # a descriptor of its own: not followed
        return None


def reach(value: Any, g: dict, followed: bool = True):
    """`(function, followed)` for the functions with globals `g` reached from
    `value` (see the module doc); `followed` is `False` below a method or class
    attribute. At most `_MAX_VISITS` values are looked at."""
    return _reach(value, g, followed, 0, [_MAX_VISITS])


def _reach(value: Any, g: dict, followed: bool, depth: int, budget: list[int]):
    value = unwrap_jitted(value)
    typ = type(value)
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0 or value is MISSING or value is None:
        return
    deeper = depth + 1
    if typ is types.FunctionType:
        if value.__globals__ is g:
            yield value, followed
        else:  # a wrapper from elsewhere keeps the function in its closure
            for cell in value.__closure__ or ():
                yield from _reach(contents(cell), g, followed, deeper, budget)
    elif typ is functools.partial:  # its function, and what its arguments hold
        yield from _reach(value.func, g, followed, deeper, budget)
        bound = (*value.args, *value.keywords.values())
        yield from _reach_items(bound, g, followed, deeper, budget)
    elif typ in (types.MethodType, staticmethod, classmethod):
        yield from _reach(value.__func__, g, followed, deeper, budget)
    elif typ is BoundMethod:
        yield from _reach(value.func, g, followed, deeper, budget)
    elif typ in _CONTAINERS:
        items = value.values() if typ is dict else value
        yield from _reach_items(items, g, followed, deeper, budget)
    elif isinstance(value, type):
        for item in class_functions(value, g):
            yield from _reach(item, g, False, deeper, budget)
    elif isinstance(value, Module):
        for leaf in _leaves(value):
            if callable(leaf):
                yield from _reach(leaf, g, followed, deeper, budget)
        for item in class_functions(typ, g):
            yield from _reach(item, g, False, deeper, budget)
    elif _own_class(typ, g):  # an object of a class of this module
        for item in class_functions(typ, g):
            yield from _reach(item, g, False, deeper, budget)
        # and the functions its attributes hold (`cfg.loss_fn`): like methods,
        # not copied in place, so what they read is keyed
        attributes = getattr(value, "__dict__", None)
        if type(attributes) is dict:
            yield from _reach_items(attributes.values(), g, False, deeper, budget)


def _reach_items(items: Any, g: dict, followed: bool, depth: int, budget: list[int]):
    """`_reach` of the callables and containers among the first `_MAX_ITEMS` of
    `items` (a container's, a partial's arguments, an object's attributes)."""
    for item in itertools.islice(items, _MAX_ITEMS):
        if callable(item) or type(item) in _CONTAINERS:
            yield from _reach(item, g, followed, depth, budget)


def _leaves(module: Module) -> list:
    import jax

    return jax.tree_util.tree_leaves(module)


def globals_of(fun: Any) -> dict | None:
    """The globals of the first plain function reached from a callable that is not
    one (a module, a bound method, a `functools.partial`)."""
    for candidate in (
        getattr(fun, "__func__", None), getattr(fun, "func", None),
        unbound(inspect.getattr_static(type(fun), "__call__", None), type(fun)),
    ):  # fmt: skip
        if type(candidate) is types.FunctionType:
            return candidate.__globals__
    return None


def _calling(wrapped: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    return call


_CALLING = _calling(None).__code__


def in_home_globals(fun: Any) -> Any:
    """`fun`; or, where `fun` is a plain function of another module wrapping one
    of the user's (`jax.grad(f)`, `jax.vmap(f)`, a library's `functools.wraps`
    decorator: its `__wrapped__` chain, through partials and bound methods, ends
    at a function with other globals), a function of the wrapped one's module
    that calls `fun`, held in its closure. Scanned, that reaches the wrapped
    function through the wrapper's closure, as when the user's own function
    calls the wrapper: what it reads is watched, and copied around the traced
    values at each trace. (Scanned as it is, the wrapper would be the library's
    code in the library's globals.)"""
    if type(fun) is not types.FunctionType or hasattr(fun, "_boxwood_jit"):
        return fun
    inner = fun
    for _ in range(MAX_DEPTH):
        wrapped: Any = getattr(inner, "__wrapped__", None)
        if type(wrapped) is types.MethodType:
            wrapped = wrapped.__func__
        elif type(wrapped) in (functools.partial, BoundMethod):
            wrapped = wrapped.func
        if type(wrapped) is not types.FunctionType:
            break
        inner = wrapped
    if inner.__globals__ is fun.__globals__:
        return fun
    code = _CALLING.replace(co_name=fun.__name__, co_qualname=fun.__qualname__)
    call = types.FunctionType(
        code, inner.__globals__, fun.__name__, None, (types.CellType(fun),)
    )
    return functools.update_wrapper(call, fun)


def _is_module(value: Any) -> bool:
    return isinstance(value, types.ModuleType)


def _watched_global(g: dict, name: str, stored: set[str]) -> bool:
    if name in stored:
        return False
    if name not in g:  # a builtin, or a name defined later
        return not hasattr(builtins, name)
    return not _is_module(g[name])


class Reads:
    """The names a function reads, found once from its code (see the module doc).

    - `globals`: global names to watch, in first-read order.
    - `cells`: `(label, cell)` of closure cells to watch.
    - `unfollowed`: `{global name: qualified name of the method}` for names read
      only where boxwood cannot pass them (methods, class attributes); watched when
      they hold arrays (or are unbound), to warn when they change.
    - `global_helpers`: global names of values holding followed functions, rebuilt
      on the traced globals.
    - `cell_helpers`: ids of cells holding them, rebuilt around traced cells.
    - `stored`: global names the followed functions assign.
    - `roots`: `{name: id}` of the values looked into, and the names unbound at
      the scan: a call that finds one of them rebound scans again (`stale`).

    **Arguments:**

    - `fun`: the function, or a callable object (a module, a bound method, a
      `functools.partial`), whose functions are then all unfollowed.
    - `g`: the globals; `fun.__globals__` for a plain function.
    """

    def __init__(self, fun: Any, g: dict | None = None) -> None:
        self.g: dict = fun.__globals__ if g is None else g
        g = self.g
        self.unfollowed: dict[str, str] = {}
        self.stored: set[str] = set()
        self.global_helpers: list[str] = []
        self.cell_helpers: set[int] = set()
        self.roots: dict[str, tuple] = {}
        self._names: dict[str, None] = {}  # read by followed functions
        self._cells: dict[int, tuple[str, types.CellType]] = {}
        self._stored_cells: set[int] = set()
        plain = type(fun) is types.FunctionType
        functions = [(fun, True)] if plain else list(reach(fun, g, False))
        # a function is scanned once as followed and once as unfollowed where it is
        # reached both ways (`helper` by name, and as an object's attribute): the
        # unfollowed path calls the original, so what it reads must be keyed too
        self._functions, self._seen = functions, {(id(f), b) for f, b in functions}
        for h, fol in functions:  # grows while it is walked
            loads, stores, deref_stores = scan_code(h.__code__)
            self.stored |= stores
            self._scan_globals(h, fol, loads)
            if fol:
                self._scan_cells(h, deref_stores)
                for value in defaults(h):  # `def f(x, helper=helper)`
                    self._follow(value, True)
        # weakly (a helper may hold `fun`): when one dies, its id in `roots` may be
        # reused by a new function, so the scan is out of date
        self._alive = [weakref.ref(f) for f, _ in functions]
        del self._functions, self._seen  # the scan's work lists: nothing kept
        names = self._names
        self.globals = [n for n in names if _watched_global(g, n, self.stored)]
        # read only where they cannot be passed: watched to warn, never inputs
        self.warn_only = {n for n in self.unfollowed if n not in names}
        self.globals += [n for n in self.unfollowed if n in self.warn_only]
        self.cells = [
            (label, cell)
            for key, (label, cell) in self._cells.items()
            if key not in self._stored_cells
            and label != "closure '__class__'"  # `super()`'s cell in a method
            and not _is_module(contents(cell))
            and contents(cell) is not fun  # a recursive inner function
        ]

    def _follow(self, value: Any, fol: bool) -> tuple[bool, bool]:
        """Queue the functions reached from `value`: (any function reached, a
        followed one reached)."""
        reached = followed = False
        functions, seen = self._functions, self._seen
        for f, f_fol in reach(value, self.g, fol):
            reached, followed = True, followed or f_fol
            if len(functions) < MAX_FUNCTIONS and (id(f), f_fol) not in seen:
                seen.add((id(f), f_fol))
                functions.append((f, f_fol))
        return reached, followed

    def _scan_globals(self, h: types.FunctionType, fol: bool, loads: list[str]) -> None:
        g = self.g
        for name in loads:
            value = g.get(name, MISSING)
            if fol:
                self._names[name] = None
            elif name not in self.unfollowed and _unfollowed_watch(value, name):
                self.unfollowed[name] = h.__qualname__
            if value is MISSING:
                if not hasattr(builtins, name):
                    self.roots[name] = (None, frozenset())
                continue
            reached, followed = self._follow(value, fol)
            if followed or reached and isinstance(value, type):
                # a helper: redefined, scan again
                self.roots[name] = (id(value), _functions(value, g))
            if followed and name not in self.global_helpers:
                self.global_helpers.append(name)

    def _scan_cells(self, h: types.FunctionType, deref_stores: set[str]) -> None:
        cells = self._cells
        for name, cell in zip(h.__code__.co_freevars, h.__closure__ or ()):
            if name in deref_stores:
                self._stored_cells.add(id(cell))
            if id(cell) in cells:
                continue
            label = closure_label(name)
            if any(label == other for other, _ in cells.values()):
                label = closure_label(f"{h.__name__}.{name}")
            cells[id(cell)] = (label, cell)
            if self._follow(contents(cell), True)[1]:
                self.cell_helpers.add(id(cell))

    def stale(self, values: Any) -> bool:
        """Whether a name looked into at the scan (or unbound then) is bound to
        another object now: a helper defined or redefined since."""
        if any(ref() is None for ref in self._alive):
            return True
        for name, (ident, functions) in list(self.roots.items()):
            value = values.get(name, MISSING)
            if (None if value is MISSING else id(value)) == ident:
                continue
            if value is MISSING or _functions(value, self.g) != functions:
                return True
            # another object holding the same functions (a partial made anew)
            self.roots[name] = (id(value), functions)
        return False


def defaults(fun: types.FunctionType) -> list[Any]:
    """The default values of `fun`'s parameters, positional and keyword-only."""
    return [*(fun.__defaults__ or ()), *(fun.__kwdefaults__ or {}).values()]


def _functions(value: Any, g: dict) -> frozenset:
    return frozenset((id(f), fol) for f, fol in reach(value, g))


def _unfollowed_watch(value: Any, name: str) -> bool:
    """Whether a global read inside a method is watched: whatever it holds but a
    Python module (a number, a function, a class, an array: a trace-time constant
    of the method, part of the cache key)."""
    return value is not MISSING and not _is_module(value)
