"""`JitWrapper`: what `filter_jit` builds for one function and its options.

It owns the wrapper's side of the cache (`_cache.py`: the `Store` shared by
wrappers of the same function and options, its plans and entries), the Python
per-call path (`_make_call`: the fast-path key, `_flat_cache.call_key`, then the
slow path that flattens), the C `FastCall` built from the same tables where the
extension is built (`_fast_call_kwargs`), and ahead-of-time lowering. What runs
under `jax.jit` is `_trace.traced_function`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from .. import _native
from .._errors import raise_as_boxwood_error
from .._flat_form import FLAT
from .._module._register import MODULE_TYPES
from . import _aot, _convention, _shardings
from ._bound import as_pytree_function
from ._cache import Entry, Plan, Store, store_for
from ._diagnostics import (
    restore_warnings,
    unhashable_error,
    warn_undonated,
)
from ._flat_cache import (
    ARRAY_TOKEN,
    ARRAY_TYPE,
    KEY_ARRAY_TYPE,
    KEY_TOKEN,
    NONE_TOKEN,
    WALKABLE,
    call_key,
    remember_walkable,
    walk,
)
from ._options import JitOptions
from ._trace import traced_function

_flatten = jax.tree_util.tree_flatten


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


class JitWrapper:
    """The callable returned by [`boxwood.filter_jit`][]."""

    def __init__(
        self,
        fun: Callable,
        options: JitOptions,
        hidden: list[str] | None = None,
    ):
        self._fun = as_pytree_function(fun)
        # capture="inputs": warn about arrays that methods of module arguments read
        # from their globals (fixed at the trace: `capture/arguments.py`)
        self._watch_methods = options.capture == "inputs"
        self._options = options
        self._store, self._fun_dyn = store_for(self._fun, options)
        # `hidden` (their labels): `args[0]` is the tuple of captured values
        # (`capture/`), never donated; the user's arguments follow it.
        self._hidden = hidden
        self._first_args = bool(hidden) + options.except_first
        self._except_first = options.donates and self._first_args > 0
        # donate="...-except-first": the first parameter's name, so that passing it
        # by keyword keeps it out of donation too
        self._first_name = (
            _first_parameter(self._fun) if options.except_first and not hidden else None
        )
        self._seen: set[int] = set()  # module arguments of the last slow call
        self._warned: set[str] = set()  # donation warnings given (once each)
        self._hits = 0
        self._misses = 0
        self._traces = 0
        wrapped = getattr(fun, "__func__", fun)
        self.__qualname__ = getattr(wrapped, "__qualname__", type(wrapped).__name__)
        self._fast = None
        self._fast_calls: list[Any] = []  # every `FastCall` of this wrapper (hits)
        self._convention = _convention.convention(
            bool(self._store.fun_dyn_idx), self._except_first
        )
        if _native.FastCall is not None:
            # The fast path in C, keyword calls included. It hands every other
            # call to the Python path, which need not walk the arguments again.
            self._fast_kwargs = self._fast_call_kwargs()
            call = self._fast = _native.FastCall(**self._fast_kwargs)
            self._fast_calls.append(call)
        else:
            call = self._make_call(walk_first=True)
        self.call = self.decorate(call, wrapped, self.clear_cache)

    def _fast_call_kwargs(self) -> dict[str, Any]:
        """What the C `FastCall` is built from (README.md, "The C boundary"): the
        tables and tokens of the key format, the call convention, the Python path
        it hands calls to, and how it reads the fields it uses (descriptors named
        here, never in C)."""
        plain = self._convention == _convention.PLAIN
        store = self._store
        return dict(
            fallback=self._make_call(walk_first=False),
            plans=store.fast_plans,
            store=store,
            walk=walk,
            after_trace=self._after_trace,
            on_error=self._on_error,
            array_type=ARRAY_TYPE,
            array_token=ARRAY_TOKEN,
            key_type=KEY_ARRAY_TYPE,
            key_token=KEY_TOKEN,
            none_token=NONE_TOKEN,
            module_types=MODULE_TYPES,
            walkable=WALKABLE,
            fun_dyn=None if plain else self._fun_dyn,
            split_first=self._convention == _convention.SPLIT_FIRST,
            first_name=self._first_name,
            flat_key=FLAT,
            entry_cold=Entry.cold,
            entry_jitted=Entry.jitted,
            entry_fast_build=Entry.fast_build,
            entry_output=Entry.output,
            plan_n_first=Plan.n_first,
            store_traces=Store.traces,
            store_tracing=Store.tracing,
            name=str(self.__qualname__),
        )

    def decorate(
        self, call: Any, wrapped: Any, clear_cache: Callable, lower: Any = None
    ) -> Any:
        """`call` as the user sees it: `fun`'s name and doc, `cache_info()`,
        `clear_cache()`."""
        functools.update_wrapper(call, wrapped, updated=())
        call.cache_info = self.cache_info
        call.clear_cache = clear_cache
        call.lower = lower or self.lower
        call._boxwood_jit = self
        return call

    def watching(
        self,
        state: Any,
        sources: tuple,
        keys: tuple,
        fallback: Callable,
        hidden: bool = True,
    ) -> Any:
        """With the C extension, a `FastCall` for a function that reads watched
        names (`capture/`): it checks in C that each name (`keys[i]` in the
        globals dict `sources[i]`, or the closure cell `sources[i]` where the key
        is `None`) is still bound to the object in `state.snap`, and then calls
        as this wrapper's own `FastCall` does with the snapshot's hidden argument
        first; any other call goes to `fallback` (the Python capture layer).
        `hidden=False`: the hidden argument is not passed (the names are
        watched only to warn when they change). `None` without the extension
        (the capture layer is then the whole path)."""
        if self._fast is None:
            return None
        call = _native.FastCall(
            **self._fast_kwargs,
            watch=state,
            watch_snap=type(state).snap,  # a slot: read through its descriptor
            watch_sources=sources,
            watch_keys=keys,
            watch_fallback=fallback,
            watch_hidden=hidden,
        )
        self._fast_calls.append(call)
        return call

    # ------------------------------------------------------------------ per call
    def _make_call(self, walk_first: bool) -> Callable:
        """The per-call path, as a closure: a plain function is called through
        CPython's vectorcall, which is cheaper than an object's `__call__`, and it
        binds like a method when used as a class attribute. `walk_first`: try the
        fast path (`_flat_cache.walk`) before flattening (`False` behind the C
        fast path, which has just tried it)."""
        store = self._store
        fun_dyn = self._fun_dyn
        # behind the C path every call it hands over has been walked already
        fast_plans = store.fast_plans if walk_first else {}
        slow_path = self._slow_path
        key_of = call_key
        conv = self._convention
        first_name = self._first_name
        plain = conv == _convention.PLAIN  # the inner jit takes `(dyn)`
        call_inner = _convention.call

        def call(*args: Any, **kwargs: Any) -> Any:
            entry = None
            if kwargs and first_name is not None and not args and first_name in kwargs:
                kwargs = dict(kwargs)  # the first argument, by keyword: positional
                args = (kwargs.pop(first_name),)
            if fast_plans:
                # arrays, modules carrying their flat form, containers of those
                # (`_flat_cache.py`): no flatten, no treedef hash, no type check
                dyn = []
                key = key_of(args, kwargs, dyn)
                if key is not None:
                    found = fast_plans.get(key)
                    if found is not None:
                        plan, entry = found
            if entry is None:
                plan, entry, dyn = slow_path(args, kwargs)
            try:
                if entry.cold or store.tracing:
                    result, traced = self._call_locked(entry, plan, dyn)
                elif plain:  # the common case first
                    traces = store.traces
                    result = entry.jitted(dyn)
                    traced = store.traces - traces
                else:
                    traces = store.traces
                    result = call_inner(conv, entry.jitted, fun_dyn, dyn, plan.n_first)
                    traced = store.traces - traces
            except BaseException as error:
                self._on_error(error)  # raises a failed `error_if` check's error
                raise
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
    def _slow_path(self, args: tuple, kwargs: dict) -> tuple[Plan, Entry, list]:
        """`(plan, entry, dyn)` of a call the fast path did not take: its
        arguments flattened, their plan and entry found (or made), and, where
        the arguments can be walked, a fast-path key noted for the next call."""
        plan, statics, leaves = self._flat_plan(args, kwargs)
        if plan.get_statics is None:
            entry = plan.only or self._entry(plan, (), args, kwargs)
            dyn = leaves
        else:
            try:
                entry = plan.entries.get(plan.key_of(statics))
            except TypeError:
                raise unhashable_error(args, kwargs, plan, self._hidden) from None
            if entry is None:
                entry = self._entry(plan, statics, args, kwargs)
            dyn = list(plan.get_dyn(leaves))  # a list, as on the fast path
        if plan.fast is not False:
            self._note_fast(args, kwargs, plan, entry, dyn, statics)
        return plan, entry, dyn

    def _flat_plan(self, args: tuple, kwargs: dict) -> tuple[Plan, tuple, list]:
        """`(plan, statics, leaves)`: a call's arguments flattened, the plan of
        their structure and leaf types, and their static leaves."""
        store = self._store
        if kwargs:
            leaves, treedef = _flatten((args, kwargs))
            plan = store.kw_plans.get(treedef)
        else:
            leaves, treedef = _flatten(args)
            plan = store.plans.get(treedef)
        types = tuple(map(type, leaves))
        if plan is None or plan.types != types:
            plan = self._plan(treedef, types, leaves, bool(kwargs))
        statics = plan.get_statics(leaves) if plan.get_statics is not None else ()
        return plan, statics, leaves

    def _note_fast(
        self,
        args: tuple,
        kwargs: dict,
        plan: Plan,
        entry: Entry,
        dyn: Any,
        statics: tuple,
    ) -> None:
        """Give `(plan, entry)` a fast-path key when the arguments can be walked
        (`_flat_cache.walk`). A module argument without a flat form gets one the
        second time it is seen, so that a model that changes every call is not
        flattened twice. The key is trusted only if the walk gives exactly the
        dynamic and static leaves that the real flatten gave."""
        seen, self._seen = self._seen, set()
        walked_statics: list = []
        complete = True
        for a in (*args, kwargs) if kwargs else args:
            step = remember_walkable(a, walked_statics, seen, self._seen)
            if step is False:
                plan.fast = False  # structural: no call with this plan can be fast
                return
            complete = complete and step is not None
        if not complete:
            return
        walked: list = []
        key = call_key(args, kwargs, walked)  # the fast path's own key
        if (
            key is None
            or len(walked) != len(dyn)
            or any(a is not b for a, b in zip(walked, dyn))
            or len(walked_statics) != len(statics)
            or any(a is not b for a, b in zip(walked_statics, statics))
        ):
            plan.fast = False  # the walk disagrees with jax's flatten for these types
            return
        self._store.fast_plans[key] = (plan, entry)
        plan.fast = True

    def _call_locked(self, entry: Entry, plan: Plan, dyn: Any) -> tuple[Any, int]:
        """Call while holding the store's lock: used until an entry's first call has
        finished and while another thread is tracing, so that threads racing on a
        new signature trace it once (the others wait, then hit the cache)."""
        store = self._store
        with store.lock:
            traces = store.traces
            result = _convention.call(
                self._convention, entry.jitted, self._fun_dyn, dyn, plan.n_first
            )
            entry.cold = False
            return result, store.traces - traces

    def _on_error(self, error: BaseException) -> None:
        """After a call that raised `error`: undo what a failed trace left behind,
        then raise the [`boxwood.BoxwoodRuntimeError`][] of a failed `error_if`
        check in place of XLA's report of it (the C path calls this too)."""
        restore_warnings()
        self._store.pending.__dict__.pop("n", None)
        raise_as_boxwood_error(error)

    def _after_trace(self, n: int, args: tuple, kwargs: dict, plan: Plan) -> None:
        restore_warnings()
        mine = self._store.pending.__dict__.pop("n", 0)
        if not mine:  # `traces` moved because another thread traced meanwhile
            self._hits += 1
            return
        self._misses += 1
        self._traces += mine
        if self._options.warns_undonated:
            warn_undonated(
                args,
                kwargs,
                plan,
                name=getattr(self, "__qualname__", "function"),
                donate=self._options.donate,
                skip_first=self._except_first,
                hidden=self._hidden,
                warned=self._warned,
            )

    def _plan(self, treedef: Any, types: tuple, leaves: list, kw: bool) -> Plan:
        store = self._store
        with store.lock:
            plan = store.plan_variants.get((kw, treedef, types))
            if plan is None:
                plan = Plan(treedef, types, leaves, kw, self._first_args)
                store.plan_variants[(kw, treedef, types)] = plan
            (store.kw_plans if kw else store.plans)[treedef] = plan
        return plan

    def _entry(self, plan: Plan, statics: tuple, args, kwargs) -> Entry:
        store = self._store
        with store.lock:
            key = plan.key_of(statics)
            entry = plan.only if not statics else plan.entries.get(key)
            if entry is not None:
                return entry
            entry = Entry()
            entry.jitted = self._jit(store, plan, statics, entry)
            if plan.get_statics is None:
                plan.only = entry
            else:
                plan.entries[key] = entry
        return entry

    def _jit(self, store: Store, plan: Plan, statics: tuple, entry: Entry) -> Any:
        inner = traced_function(
            self._fun,
            store,
            plan,
            statics,
            entry,
            options=self._options,
            name=self.__qualname__,
            conv=self._convention,
            hidden=self._hidden,
            watch_methods=self._watch_methods,
        )
        return jax.jit(inner, **self._jit_options(store, plan))

    def _jit_options(self, store: Store, plan: Plan) -> dict[str, Any]:
        """Keyword arguments for the inner `jax.jit` of one plan.

        This is the extension point for per-leaf options: the inner function takes
        flat lists of arrays, in the order of `plan.dyn_idx`, so an option given as a
        pytree prefix of the arguments (e.g. `in_shardings`) is broadcast over the
        arguments' leaves and picked at `plan.dyn_idx` here.
        """
        options = self._options.jit_kwargs()
        options.pop("out_shardings", None)  # applied inside `inner` (_shardings.py)
        if options.get("in_shardings") is not None:
            options["in_shardings"] = _shardings.in_shardings(
                options["in_shardings"], plan, self._convention, bool(self._hidden)
            )
        if self._options.donates:
            options["donate_argnums"] = _convention.donate_argnums(self._convention)
        return options

    # ------------------------------------------------------------- public API
    def cache_info(self) -> CacheInfo:
        """`(hits, misses, traces, size)` for this wrapper (see [`CacheInfo`][])."""
        hits = self._hits + sum(fast.hits for fast in self._fast_calls)
        return CacheInfo(hits, self._misses, self._traces, self._store.size)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower for these arguments without running (see `Lowered`):
        `.lower(*args).compile()` gives a `Compiled` that takes the
        same arguments as the function and returns its output. JAX's own
        `Lowered` of the inner function (flat lists of arrays) is its `.flat`.

        **Arguments:** the arguments of a call.

        **Returns:** a `boxwood.Lowered`.
        """
        return self.lower_with(lambda: (), args, kwargs)

    def lower_with(self, prefix: Callable[[], tuple], args: tuple, kwargs: dict):
        """`lower`, with `prefix()` (the captured values' hidden argument) before
        the arguments, at lowering and at each call of the compiled object."""
        args, kwargs, plan, statics, dyn = self._prepare((*prefix(), *args), kwargs)
        entry = self._entry(plan, statics, args, kwargs)
        lowerer = _Lowerer(entry.jitted)
        try:
            flat = _convention.call(
                self._convention, lowerer, self._fun_dyn, dyn, plan.n_first
            )
        finally:
            restore_warnings()
            self._traces += self._store.pending.__dict__.pop("n", 0)
        return _aot.Lowered(
            flat, _aot._AotCall(self, prefix, plan, plan.key_of(statics))
        )

    def _prepare(self, args: tuple, kwargs: dict) -> tuple:
        """`(args, kwargs, plan, statics, dyn)` of a call, on the slow path."""
        if kwargs and self._first_name is not None and not args:
            if self._first_name in kwargs:
                kwargs = dict(kwargs)
                args = (kwargs.pop(self._first_name),)
        plan, statics, leaves = self._flat_plan(args, kwargs)
        return args, kwargs, plan, statics, list(plan.get_dyn(leaves))

    def clear_cache(self) -> None:
        """Forget compiled code and reset the counters."""
        self._store.clear()
        self._hits = self._misses = self._traces = 0
        for fast in self._fast_calls:
            fast.hits = 0


class _Lowerer:
    """Calls `jitted.lower` with the arguments of a call of `jitted`."""

    def __init__(self, jitted: Any) -> None:
        self.jitted = jitted

    def __call__(self, *args: Any) -> Any:
        return self.jitted.lower(*args)


def _first_parameter(fun: Callable) -> str | None:
    """The name of `fun`'s first parameter, if it can be passed by keyword too."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None
    if params and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return params[0].name
    return None
