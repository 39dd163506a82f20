"""`filter_jit`: `jax.jit` for any mix of modules, arrays and Python objects.

How a call flows (each step is on the per-call path, so each is kept small):

1. `(args, kwargs)` is flattened once on JAX's C++ pytree path. Module configuration
   is already in the treedef.
2. The leaves' types decide which are arrays (traced) and which are static (hashed
   by value). A `_Plan`, cached per treedef, holds that split; it is found by one
   dict lookup on the treedef and one tuple comparison of the leaf types.
3. Static leaves (often none) pick an `_Entry`: one inner `jax.jit` over flat lists
   of arrays. Shapes and dtypes are left to `jax.jit`'s own C++ cache, so boxwood
   never computes a per-leaf signature in Python.
4. The inner function is called without blocking (asynchronous dispatch is kept).
5. Outputs are rebuilt from the returned arrays and the output structure recorded
   when the function was traced.

Tracing happens inside the inner function, so counting traces and explaining
recompiles (`_explain.py`) costs nothing on calls that do not trace.
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from ._bound import BoundMethod, as_pytree_function
from ._config import config
from ._explain import describe_call, explain
from ._filters import is_array
from ._pretty import array_summary
from ._rebuild import compile_builder
from ._warnings import PerformanceWarning, RecompileWarning, user_stacklevel

_flatten = jax.tree_util.tree_flatten

_DONATE_MODES = ("none", "all", "all-except-first", "warn", "warn-except-first")
_DONATION_MESSAGE = "Some donated buffers were not usable"
_MAX_EXPLAIN_RECORDS = 32
_CHURN_THRESHOLD = 5


class CacheInfo(NamedTuple):
    """What `filter_jit(f).cache_info()` returns.

    - `hits`: calls that ran already-compiled code.
    - `misses`: calls that had to trace (and compile).
    - `traces`: times the Python function was traced.
    - `size`: compiled variants currently cached.
    """

    hits: int
    misses: int
    traces: int
    size: int


def _picker(indices: tuple[int, ...]) -> Callable[[list], tuple]:
    if len(indices) == 1:
        (i,) = indices
        return lambda leaves: (leaves[i],)
    return __import__("operator").itemgetter(*indices)


def _merge(n: int, dyn_idx, dyn, static_idx, statics) -> list:
    leaves: list = [None] * n
    for i, x in zip(dyn_idx, dyn):
        leaves[i] = x
    for i, x in zip(static_idx, statics):
        leaves[i] = x
    return leaves


class _Out:
    """The output structure recorded when tracing, and its compiled builder."""

    __slots__ = ("key", "n", "dyn_idx", "static_idx", "statics", "build")

    def __init__(self, treedef: Any, dyn_idx: tuple, static_idx: tuple, statics: tuple):
        self.key = (treedef, dyn_idx, static_idx, statics)
        self.n = treedef.num_leaves
        self.dyn_idx = dyn_idx
        self.static_idx = static_idx
        self.statics = statics
        self.build = compile_builder(treedef)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Out) and self.key == other.key

    __hash__ = None  # type: ignore[assignment]

    def rebuild(self, dyn: list) -> Any:
        if not self.static_idx:
            return self.build(dyn)
        return self.build(_merge(self.n, self.dyn_idx, dyn, self.static_idx, self.statics))


def _signature(leaves) -> tuple:
    return tuple((x.shape, x.dtype, bool(getattr(x, "weak_type", False))) for x in leaves)


class _Entry:
    """One inner `jax.jit` for one (structure, leaf types, static values)."""

    __slots__ = (
        "jitted", "out", "outs", "shape_sensitive", "cold", "fast_build", "__weakref__",
    )  # fmt: skip

    def __init__(self) -> None:
        self.cold = True  # no call has completed yet
        self.fast_build = None  # output builder, when outputs are all arrays
        self.jitted: Any = None
        self.out: _Out | None = None
        self.outs: dict[tuple, _Out] = {}
        self.shape_sensitive = False

    def record(self, sig: tuple, out: _Out) -> None:
        self.outs[sig] = out
        if self.out is None:
            self.out = out
        elif self.out != out:
            # The output structure depends on input shapes (e.g. `return x.shape[0]`):
            # from now on, calls pick the structure by their shapes.
            self.shape_sensitive = True
        ok = not self.shape_sensitive and not self.out.static_idx
        self.fast_build = self.out.build if ok else None

    def output(self, fun_dyn: list, dyn: list, result: list) -> Any:
        if self.shape_sensitive:
            return self.outs[_signature([*fun_dyn, *dyn])].rebuild(result)
        return self.out.rebuild(result)


class _Plan:
    """How to split the leaves of one treedef (with given leaf types)."""

    __slots__ = (
        "treedef", "types", "n", "dyn_idx", "static_idx", "get_dyn", "get_statics",
        "n_first", "entries", "only",
    )  # fmt: skip

    def __init__(self, treedef: Any, types: tuple, leaves: list) -> None:
        self.treedef = treedef
        self.types = types
        self.n = len(leaves)
        dyn_mask = [is_array(x) for x in leaves]
        self.dyn_idx = tuple(i for i, d in enumerate(dyn_mask) if d)
        self.static_idx = tuple(i for i, d in enumerate(dyn_mask) if not d)
        self.get_dyn = _picker(self.dyn_idx) if self.dyn_idx else lambda leaves: ()
        self.get_statics = _picker(self.static_idx) if self.static_idx else None
        # Dynamic leaves of `args[0]` come first: how many there are (for donation).
        args_def = treedef.children()[0]
        first = args_def.children()[0].num_leaves if args_def.num_leaves and args_def.children() else 0
        self.n_first = sum(dyn_mask[:first])
        self.entries: dict[tuple, _Entry] = {}
        self.only: _Entry | None = None


class _Store:
    """Compiled code for one function, shared by wrappers of the same function (for
    example the bound methods of two modules with the same structure)."""

    def __init__(self, fun_def: Any, fun_dyn_idx, fun_static_idx, fun_statics) -> None:
        self.fun_def = fun_def
        self.fun_dyn_idx = fun_dyn_idx
        self.fun_static_idx = fun_static_idx
        self.fun_statics = fun_statics
        self.plans: dict[Any, _Plan] = {}
        self.plan_variants: dict[tuple, _Plan] = {}
        self.lock = threading.RLock()
        self.traces = 0
        self.tracing = 0  # traces in progress (any thread)
        self.size = 0
        self.records: list[dict] = []

    def function(self, fun_dyn: list) -> Callable:
        leaves = _merge(
            self.fun_def.num_leaves, self.fun_dyn_idx, fun_dyn,
            self.fun_static_idx, self.fun_statics,
        )  # fmt: skip
        return self.fun_def.unflatten(leaves)

    def clear(self) -> None:
        with self.lock:
            self.plans.clear()
            self.plan_variants.clear()
            self.records.clear()
            self.size = 0


# Stores are shared between wrappers of the same function; held weakly so that a
# function's compiled code dies with the last wrapper that uses it.
_STORES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_STORES_LOCK = threading.Lock()
_WRAPS_AT_SITE: dict[tuple, int] = {}

MSG_CHURN = (
    "This line has wrapped {n} different function objects created from the same "
    "code (`{name}` at {where}) with `filter_jit`. Each new wrapper of a new function object compiles "
    "again. This usually means `filter_jit(lambda ...)` or `filter_jit(f)` of a "
    "freshly defined `f` inside a loop. Wrap the function once, outside the loop, "
    "and pass what changes as arguments."
)


def _note_wrap(fun: Callable) -> None:
    """Warn once when one line of user code keeps wrapping new function objects of
    the same code: `filter_jit(lambda ...)` inside a loop."""
    func = fun.func if isinstance(fun, BoundMethod) else fun
    code = getattr(func, "__code__", None)
    if code is None:
        return
    frame = sys._getframe(user_stacklevel() - 1)
    site = (frame.f_code.co_filename, frame.f_lineno, code)
    with _STORES_LOCK:
        n = _WRAPS_AT_SITE[site] = _WRAPS_AT_SITE.get(site, 0) + 1
    if n == _CHURN_THRESHOLD:
        where = f"{code.co_filename}:{code.co_firstlineno}"
        warnings.warn(
            MSG_CHURN.format(n=n, name=code.co_name, where=where),
            PerformanceWarning,
            stacklevel=user_stacklevel(),
        )


def _store_for(fun: Callable) -> tuple[_Store, list]:
    leaves, fun_def = _flatten(fun)
    dyn_idx = tuple(i for i, x in enumerate(leaves) if is_array(x))
    static_idx = tuple(i for i, x in enumerate(leaves) if not is_array(x))
    statics = tuple(leaves[i] for i in static_idx)
    key = (fun_def, statics)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _Store(fun_def, dyn_idx, static_idx, statics)
            _STORES[key] = store
            created = True
        else:
            created = False
    if created:
        _note_wrap(fun)
    return store, [leaves[i] for i in dyn_idx]


def _unhashable_error(args: tuple, kwargs: dict, plan: _Plan) -> TypeError:
    keyed, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    for i in plan.static_idx:
        keys, leaf = keyed[i]
        try:
            hash(leaf)
        except TypeError:
            path, leaf = _deepest_unhashable(_user_path(keys), leaf)
            return TypeError(
                f"`filter_jit`: the non-array value at `{path}` (of type "
                f"{type(leaf).__name__}) is not hashable. Non-array leaves are static: "
                "they are hashed by value to choose the compiled code. Use a tuple "
                "instead of a list (or a frozenset instead of a set), pass numbers "
                "that should be traced as `jnp.asarray(...)`, or make the containing "
                "class a pytree (subclass `boxwood.Module`)."
            )
    return TypeError("`filter_jit`: a non-array argument is not hashable.")


def _deepest_unhashable(path: str, obj: Any) -> tuple[str, Any]:
    for name, value in getattr(obj, "__dict__", {}).items():
        try:
            hash(value)
        except TypeError:
            return _deepest_unhashable(f"{path}.{name}", value)
    return path, obj


def _user_path(keys: tuple) -> str:
    first, second, *rest = keys
    head = "args" if first.idx == 0 else "kwargs"
    return head + jax.tree_util.keystr((second, *rest))


class _JitWrapper:
    """The callable returned by [`boxwood.filter_jit`][]."""

    def __init__(self, fun: Callable, donate: str, explain: bool | None, jit_kwargs: dict):
        self._fun = as_pytree_function(fun)
        self._store, self._fun_dyn = _store_for(self._fun)
        self._donate = donate
        self._explain = explain
        self._jit_kwargs = jit_kwargs
        self._except_first = donate.endswith("except-first")
        self._hits = 0
        self._misses = 0
        self._traces = 0
        wrapped = getattr(fun, "__func__", fun)
        self.__qualname__ = getattr(wrapped, "__qualname__", type(wrapped).__name__)
        call = self._make_call()
        functools.update_wrapper(call, wrapped, updated=())
        call.cache_info = self.cache_info
        call.clear_cache = self.clear_cache
        call._boxwood_jit = self
        self.call = call

    # ------------------------------------------------------------------ per call
    def _make_call(self) -> Callable:
        """The per-call path, as a closure: a plain function is called through
        CPython's vectorcall, which is cheaper than an object's `__call__`, and it
        binds like a method when used as a class attribute."""
        store = self._store
        fun_dyn = self._fun_dyn
        plans = store.plans
        except_first = self._except_first

        def call(*args: Any, **kwargs: Any) -> Any:
            leaves, treedef = _flatten((args, kwargs))
            types = tuple(map(type, leaves))
            plan = plans.get(treedef)
            if plan is None or plan.types != types:
                plan = self._plan(treedef, types, leaves)
            if plan.get_statics is None:
                entry = plan.only or self._entry(plan, (), args, kwargs)
                dyn = leaves
            else:
                statics = plan.get_statics(leaves)
                try:
                    entry = plan.entries.get(statics)
                except TypeError:
                    raise _unhashable_error(args, kwargs, plan) from None
                if entry is None:
                    entry = self._entry(plan, statics, args, kwargs)
                dyn = plan.get_dyn(leaves)
            if entry.cold or store.tracing:
                result, traced = self._call_locked(entry, plan, dyn)
            else:
                traces = store.traces
                if except_first:
                    k = plan.n_first
                    result = entry.jitted(fun_dyn, dyn[:k], dyn[k:])
                else:
                    result = entry.jitted(fun_dyn, dyn)
                traced = store.traces - traces
            if traced:
                self._after_trace(traced, args, kwargs, plan)
            else:
                self._hits += 1
            build = entry.fast_build
            if build is not None:
                return build(result)
            return entry.output(fun_dyn, dyn, result)

        return call

    # ------------------------------------------------------------- slow paths
    def _call_locked(self, entry: _Entry, plan: _Plan, dyn: Any) -> tuple[Any, int]:
        """Call while holding the store's lock: used until an entry's first call has
        finished and while another thread is tracing, so that threads racing on a
        new signature trace it once (the others wait, then hit the cache)."""
        store = self._store
        with store.lock:
            traces = store.traces
            if self._except_first:
                k = plan.n_first
                result = entry.jitted(self._fun_dyn, dyn[:k], dyn[k:])
            else:
                result = entry.jitted(self._fun_dyn, dyn)
            entry.cold = False
            return result, store.traces - traces

    def _after_trace(self, n: int, args: tuple, kwargs: dict, plan: _Plan) -> None:
        self._misses += 1
        self._traces += n
        pending = _PENDING_FILTER.__dict__.pop("filter", None)
        if pending is not None:
            try:
                warnings.filters.remove(pending)
            except ValueError:
                pass
        if self._donate.startswith("warn"):
            _warn_undonated(self, args, kwargs, plan)

    def _plan(self, treedef: Any, types: tuple, leaves: list) -> _Plan:
        store = self._store
        with store.lock:
            plan = store.plan_variants.get((treedef, types))
            if plan is None:
                plan = _Plan(treedef, types, leaves)
                store.plan_variants[(treedef, types)] = plan
            store.plans[treedef] = plan
        return plan

    def _entry(self, plan: _Plan, statics: tuple, args, kwargs) -> _Entry:
        store = self._store
        with store.lock:
            entry = plan.only if not statics else plan.entries.get(statics)
            if entry is not None:
                return entry
            entry = _Entry()
            entry.jitted = self._jit(store, plan, statics, entry)
            if plan.get_statics is None:
                plan.only = entry
            else:
                plan.entries[statics] = entry
        return entry

    def _jit(self, store: _Store, plan: _Plan, statics: tuple, entry: _Entry) -> Any:
        wrapper = weakref.ref(self)
        entry_ref = weakref.ref(entry)

        def inner(fun_dyn, *groups):
            dyn = groups[0] if len(groups) == 1 else [*groups[0], *groups[1]]
            leaves = _merge(plan.n, plan.dyn_idx, dyn, plan.static_idx, statics)
            args, kwargs = plan.treedef.unflatten(leaves)
            _on_trace(wrapper(), store, args, kwargs)
            store.tracing += 1
            try:
                out = store.function(fun_dyn)(*args, **kwargs)
            finally:
                store.tracing -= 1
            out_leaves, out_def = _flatten(out)
            mask = [is_array(x) for x in out_leaves]
            dyn_idx = tuple(i for i, m in enumerate(mask) if m)
            static_idx = tuple(i for i, m in enumerate(mask) if not m)
            record = _Out(out_def, dyn_idx, static_idx, tuple(out_leaves[i] for i in static_idx))
            target = entry_ref()
            if target is not None:
                target.record(_signature([*fun_dyn, *dyn]), record)
            return [out_leaves[i] for i in dyn_idx]

        inner.__qualname__ = self.__qualname__
        inner.__name__ = self.__qualname__.rsplit(".", 1)[-1]
        donate = ()
        if self._donate != "none":
            donate = (2,) if self._except_first else (1,)
        return jax.jit(inner, donate_argnums=donate, **self._jit_kwargs)

    # ------------------------------------------------------------- public API
    def cache_info(self) -> CacheInfo:
        """`(hits, misses, traces, size)` for this wrapper (see [`CacheInfo`][])."""
        return CacheInfo(self._hits, self._misses, self._traces, self._store.size)

    def clear_cache(self) -> None:
        """Forget compiled code and reset the counters."""
        self._store.clear()
        self._hits = self._misses = self._traces = 0



def _warn_undonated(wrapper: _JitWrapper, args: tuple, kwargs: dict, plan: _Plan) -> None:
    """After a call that compiled: name the donated inputs XLA could not reuse."""
    keyed, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    start = plan.n_first if wrapper._except_first else 0
    kept = [
        f"{_user_path(keyed[i][0])} {array_summary(keyed[i][1])}"
        for i in plan.dyn_idx[start:]
        if not (isinstance(keyed[i][1], jax.Array) and keyed[i][1].is_deleted())
    ]
    if kept:
        warnings.warn(
            f"filter_jit({getattr(wrapper, '__qualname__', 'function')}, "
            f"donate={wrapper._donate!r}): {len(kept)} input buffer(s) could not be "
            f"donated (no output of the same shape and dtype could reuse them): "
            f"{', '.join(kept)}. Use donate='all' to donate without this warning, or "
            "donate='none'.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# A warnings filter pushed while tracing with donate="all" and removed right after
# the call that traced: JAX warns about undonatable buffers while compiling, and
# "all" means "don't warn" (while "warn" keeps JAX's warning).
_PENDING_FILTER = threading.local()


def _on_trace(wrapper: _JitWrapper | None, store: _Store, args: tuple, kwargs: dict) -> None:
    with store.lock:
        store.traces += 1
        store.size += 1
        record = describe_call(args, kwargs)
        previous = list(store.records)
        store.records.append(record)
        del store.records[:-_MAX_EXPLAIN_RECORDS]
    if wrapper is None:
        return
    if wrapper._donate in ("all", "all-except-first"):
        warnings.filterwarnings("ignore", message=_DONATION_MESSAGE)
        _PENDING_FILTER.filter = warnings.filters[0]
    enabled = config.explain_recompiles if wrapper._explain is None else wrapper._explain
    if enabled and previous:
        lines = explain(previous, record) or [
            "no difference in the arguments' structure, static values, shapes or "
            "dtypes (JAX retraced for another reason, e.g. cleared caches)"
        ]
        name = getattr(wrapper, "__qualname__", "function")
        text = "\n".join("  " + line for line in lines)
        warnings.warn(
            f"filter_jit({name}) is recompiling (trace {store.traces}; "
            f"{len(previous)} earlier signature(s)). Compared with the closest earlier "
            f"call:\n{text}",
            RecompileWarning,
            stacklevel=user_stacklevel(),
        )


def filter_jit(
    fun: Callable | None = None,
    *,
    donate: str = "none",
    explain: bool | None = None,
    **jit_kwargs: Any,
) -> Any:
    """Compile `fun` with `jax.jit`, tracing every array and keeping everything else
    static, for any arguments: modules, pytrees, arrays, Python objects.

    **Arguments:**

    - `fun`: the function to compile. A bound method of a module
      (`filter_jit(model.__call__)`) traces the module's arrays too.
    - `donate`: `"none"` (default), `"all"` (donate every input array's buffer and
      suppress JAX's "not usable" warning), `"all-except-first"` (all but those of
      the first argument), `"warn"` / `"warn-except-first"` (the same, keeping JAX's
      warning when a buffer cannot be donated). The arrays of a bound method's
      module are never donated.
    - `explain`: `True` warns with a [`boxwood.RecompileWarning`][] on every retrace
      after the first, naming what changed; `None` follows
      `boxwood.config.explain_recompiles`.

    **Returns:** a wrapped function. Array leaves of the output are `jax.Array`s;
    non-array leaves come back as the same Python objects. The call returns as
    soon as the computation is enqueued (like `jax.jit`). The wrapper has
    `cache_info()` and `clear_cache()`.

    ```python
    @boxwood.filter_jit
    def train_step(model, opt_state, x, y):
        ...

    train_step(model, opt_state, x, y)  # compiles once, for these shapes
    ```
    """
    if donate not in _DONATE_MODES:
        raise ValueError(
            f"`filter_jit(donate=...)` must be one of {', '.join(map(repr, _DONATE_MODES))}; "
            f"got {donate!r}."
        )
    unknown = set(jit_kwargs) - _EXTENSION_KWARGS
    if unknown:
        raise TypeError(
            f"`filter_jit` got unexpected keyword argument(s) {sorted(unknown)}. "
            "There is no `static_argnums`: non-array arguments are static automatically."
        )
    if fun is None:
        return lambda f: filter_jit(f, donate=donate, explain=explain, **jit_kwargs)
    if not callable(fun):
        raise TypeError(f"`filter_jit` expects a callable, got {type(fun).__name__}.")
    return _JitWrapper(fun, donate, explain, jit_kwargs).call


# Keyword arguments passed through to the inner `jax.jit` (the extension point for
# sharding, which needs them translated from pytree prefixes first).
_EXTENSION_KWARGS: set[str] = {"keep_unused", "inline", "compiler_options"}
