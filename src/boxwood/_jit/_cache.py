"""The cache behind `filter_jit`: how leaves are split, what is compiled, and the
per-function stores shared by wrappers (see README.md for how a call flows)."""

from __future__ import annotations

import collections
import operator
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, cast

import jax

from .._caches import register_cache_clear
from .._filters import is_array
from .._module import BoundMethod, compile_builder, needs_strict, strict
from .._module import merge_leaves as merge
from .._warnings import PerformanceWarning, user_stacklevel
from ._capture import Traced
from ._options import JitOptions

_flatten = jax.tree_util.tree_flatten
_CHURN_THRESHOLD = 5


def _picker(indices: tuple[int, ...]) -> Callable[[list], tuple]:
    if len(indices) == 1:
        (i,) = indices
        return lambda leaves: (leaves[i],)
    return operator.itemgetter(*indices)


class Out:
    """The output structure recorded when tracing, and its compiled builder."""

    __slots__ = ("key", "build")

    def __init__(self, treedef: Any, static_idx: tuple, statics: tuple):
        self.key = (treedef, static_idx, statics, tuple(map(strict, statics)))
        # static outputs are built into the builder: it takes the arrays only
        self.build = compile_builder(
            treedef, dict(zip(static_idx, statics)), remember=True
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Out) and self.key == other.key

    # compared by value but never a dict key; the stubs type `__hash__` as a method
    __hash__ = None  # pyright: ignore[reportAssignmentType]


def signature(leaves) -> tuple:
    return tuple(
        (x.shape, x.dtype, bool(getattr(x, "weak_type", False))) for x in leaves
    )


class Entry:
    """One inner `jax.jit` for one (structure, leaf types, static values)."""

    __slots__ = (
        "jitted", "out", "outs", "shape_sensitive", "cold", "fast_build", "__weakref__",
    )  # fmt: skip

    def __init__(self) -> None:
        self.cold = True  # no call has completed yet
        self.fast_build = None  # output builder, unless it depends on input shapes
        self.jitted: Any = None
        self.out: Out | None = None
        self.outs: dict[tuple, Out] = {}
        self.shape_sensitive = False

    def record(self, sig: tuple, out: Out) -> None:
        self.outs[sig] = out
        if self.out is None:
            self.out = out
        elif self.out != out:
            # The output structure depends on input shapes (e.g. `return x.shape[0]`):
            # from now on, calls pick the structure by their shapes.
            self.shape_sensitive = True
        self.fast_build = None if self.shape_sensitive else self.out.build

    def output(self, fun_dyn: list, dyn: list, result: list) -> Any:
        if self.shape_sensitive:
            return self.outs[signature([*fun_dyn, *dyn])].build(result)
        return cast(Out, self.out).build(result)


def _same(statics: tuple) -> tuple:
    return statics


def _strict_key(statics: tuple) -> tuple:
    return (statics, tuple(map(strict, statics)))


class Plan:
    """How to split the leaves of one treedef (with given leaf types)."""

    __slots__ = (
        "treedef", "types", "n", "dyn_idx", "static_idx", "get_dyn", "get_statics",
        "n_first", "entries", "only", "kw", "fast", "key_of",
    )  # fmt: skip

    def __init__(
        self, treedef: Any, types: tuple, leaves: list, kw: bool, first_args: int = 1
    ) -> None:
        # `kw`: the leaves are those of `(args, kwargs)`; otherwise of `args` alone
        # (calls without keyword arguments skip flattening an empty dict).
        self.kw = kw
        self.treedef = treedef
        self.types = types
        self.n = len(leaves)
        dyn_mask = [is_array(x) for x in leaves]
        self.dyn_idx = tuple(i for i, d in enumerate(dyn_mask) if d)
        self.static_idx = tuple(i for i, d in enumerate(dyn_mask) if not d)
        self.get_dyn = _picker(self.dyn_idx) if self.dyn_idx else lambda leaves: ()
        self.get_statics = _picker(self.static_idx) if self.static_idx else None
        # the key of `entries` for the static leaves: the values, and where values
        # of these types can equal another type's or differ in sign (`0.0` and
        # `-0.0`), their strict form too (`_module/_static_key.py`)
        strict_types = needs_strict(tuple(types[i] for i in self.static_idx))
        self.key_of = _strict_key if strict_types else _same
        # Dynamic leaves of the first `first_args` arguments come first: how many
        # there are (for donation; 2 when `args[0]` is the captured values).
        args_def = treedef.children()[0] if kw else treedef
        first = sum(c.num_leaves for c in args_def.children()[:first_args])
        self.n_first = sum(dyn_mask[:first])
        self.entries: dict[tuple, Entry] = {}
        self.only: Entry | None = None
        # whether calls with this plan can take the fast path (None: not known yet)
        self.fast: bool | None = None


class Store:
    """Compiled code for one function, shared by wrappers of the same function (for
    example the bound methods of two modules with the same structure)."""

    __slots__ = (
        "fun_def", "fun_dyn_idx", "fun_static_idx", "fun_statics", "plans",
        "kw_plans", "fast_plans", "plan_variants", "lock", "trace_lock", "traces",
        "tracing", "pending", "size", "records", "__weakref__",
    )  # fmt: skip

    def __init__(self, fun_def: Any, fun_dyn_idx, fun_static_idx, fun_statics) -> None:
        self.fun_def = fun_def
        self.fun_dyn_idx = fun_dyn_idx
        self.fun_static_idx = fun_static_idx
        self.fun_statics = fun_statics
        self.plans: dict[Any, Plan] = {}  # calls without keyword arguments
        self.kw_plans: dict[Any, Plan] = {}
        # `_module/_flat_key.py`'s `call_key` keys -> (plan, entry), for entries whose first
        # call has completed: calls that skip flattening
        self.fast_plans: dict[tuple, tuple[Plan, Entry]] = {}
        self.plan_variants: dict[tuple, Plan] = {}
        # `lock`: plans, entries, and a cold entry's first call (held across that
        # call into JAX). `trace_lock`: what a trace records (`on_trace`), and
        # nothing else. A trace must never need `lock`: JAX makes a thread that
        # calls a signature another thread is tracing wait for that trace, and the
        # waiting thread may hold `lock` (`Dispatch.call_locked`); so that trace, needing
        # `lock`, would never finish. Order: `lock` before `trace_lock`.
        self.lock = threading.RLock()
        self.trace_lock = threading.Lock()
        # `traces` and `tracing` change under `trace_lock` only (`begin_trace`,
        # `end_trace`); the warm path reads them without a lock
        self.traces = 0  # every thread's: a call compares it before and after
        self.tracing = 0  # traces in progress (any thread)
        # this thread's traces not yet reported (`pending.n`): a call that saw
        # `traces` move while another thread traced is a hit, not a miss
        self.pending = threading.local()
        self.size = 0
        self.records: list[dict] = []

    def begin_trace(self) -> None:
        """A trace of this store's function starts (on any thread)."""
        with self.trace_lock:
            self.tracing += 1

    def end_trace(self) -> None:
        """A trace started with `begin_trace` has ended, however it ended."""
        with self.trace_lock:
            self.tracing -= 1

    def function(self, fun_dyn: list) -> Callable:
        leaves = merge(
            self.fun_def.num_leaves, self.fun_dyn_idx, fun_dyn,
            self.fun_static_idx, self.fun_statics,
        )  # fmt: skip
        return self.fun_def.unflatten(leaves)

    def clear(self) -> None:
        with self.lock, self.trace_lock:
            self.plans.clear()
            self.kw_plans.clear()
            self.fast_plans.clear()
            self.plan_variants.clear()
            self.records.clear()
            self.size = 0


# Stores are shared between wrappers of the same function; held weakly so that a
# function's compiled code dies with the last wrapper that uses it.
_STORES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_STORES_LOCK = threading.Lock()


@register_cache_clear
def clear_stores() -> None:
    """Empty the compiled programs of every live `filter_jit` wrapper (held by the
    wrapper; the registry of them is weak): part of `boxwood.clear_caches`."""
    with _STORES_LOCK:
        stores = list(_STORES.values())
    for store in stores:
        store.clear()


# call site -> (wraps of distinct function objects, weakref to the last function,
# weakref to the code object that made the wraps), for the most recent
# `_MAX_SITES` sites; a site is named by file, line and the code's name and first
# line, so no code object is kept alive.
_WRAPS_AT_SITE: collections.OrderedDict[tuple, tuple[int, Any, Any]] = (
    collections.OrderedDict()
)
_MAX_SITES = 256

MSG_CHURN = (
    "This line has wrapped {n} different function objects created from the same "
    "code (`{name}` at {where}) with `filter_jit`. Each new wrapper of a new function object compiles "
    "again. This usually means `filter_jit(lambda ...)` or `filter_jit(f)` of a "
    "freshly defined `f` inside a loop. Wrap the function once, outside the loop, "
    "and pass what changes as arguments."
)


def _note_wrap(fun: Callable) -> None:
    """Warn once when one line of user code keeps wrapping new function objects of
    the same code: `filter_jit(lambda ...)` inside a loop.

    Wraps count while the same code object runs the line: a loop, or a function
    called again and again. Code compiled anew (a notebook cell run again: ipykernel
    names a cell's file by a hash of its text, so every run is the same file and
    line, but each run compiles the cell again) starts the count again."""
    func = fun.func if isinstance(fun, BoundMethod) else fun
    if isinstance(func, Traced):  # a function that captures values: the user's own
        func = func.function
    code = getattr(func, "__code__", None)
    if code is None:
        return
    frame = sys._getframe(user_stacklevel() - 1)
    site = (
        frame.f_code.co_filename, frame.f_lineno, code.co_name, code.co_firstlineno
    )  # fmt: skip
    try:
        ref = weakref.ref(func)
        caller = frame.f_code
        caller_ref = weakref.ref(caller)
    except TypeError:
        return
    with _STORES_LOCK:
        n, last, last_caller = _WRAPS_AT_SITE.get(site, (0, None, None))
        if last is not None and last() is func:
            return  # the same function again (its compiled code had been freed)
        if last_caller is None or last_caller() is not caller:
            n = 0  # the line's code was compiled again: a re-run cell, not a loop
        n += 1
        _WRAPS_AT_SITE[site] = (n, ref, caller_ref)
        _WRAPS_AT_SITE.move_to_end(site)
        if len(_WRAPS_AT_SITE) > _MAX_SITES:
            _WRAPS_AT_SITE.popitem(last=False)
    if n == _CHURN_THRESHOLD:
        where = f"{code.co_filename}:{code.co_firstlineno}"
        warnings.warn(
            MSG_CHURN.format(n=n, name=code.co_name, where=where),
            PerformanceWarning,
            stacklevel=user_stacklevel(),
        )


def store_for(fun: Callable, options: JitOptions) -> tuple[Store, list]:
    """The store of compiled code for `fun` with `options` (shared with every other
    wrapper of the same function structure and options), and `fun`'s own arrays."""
    leaves, fun_def = _flatten(fun)
    dyn_idx = tuple(i for i, x in enumerate(leaves) if is_array(x))
    static_idx = tuple(i for i, x in enumerate(leaves) if not is_array(x))
    statics = tuple(leaves[i] for i in static_idx)
    key = (fun_def, statics, tuple(map(strict, statics)), options.key)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = Store(fun_def, dyn_idx, static_idx, statics)
            _STORES[key] = store
            created = True
        else:
            created = False
    if created:
        _note_wrap(fun)
    return store, [leaves[i] for i in dyn_idx]
