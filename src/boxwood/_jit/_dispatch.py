"""`Dispatch`: everything a `filter_jit` wrapper does for a call that the warm path
(`_warm.py`) does not serve, and the counters of both.

A call the warm path does not know is flattened once (`find`): its treedef and
leaf types pick a `Plan`, its static leaves an `Entry` (made with its inner
`jax.jit`, `jit`, where new). The first call of an entry, and every call while
another thread traces this function, runs under the store's lock
(`call_locked`), so that threads racing on a new signature trace it once. After
the call, where the arguments can be walked, their key is noted for the warm path
(`note_fast`). What runs under `jax.jit` is `_trace.traced_function`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from .._errors import raise_as_boxwood_error
from .._module import call_key, remember_walkable
from . import _checked_jit, _convention, _shardings
from ._cache import Entry, Plan, Store, store_for
from ._capture import warn_argument_methods
from ._diagnostics import restore_warnings, unhashable_error, warn_undonated
from ._options import JitOptions
from ._trace import traced_function

_flatten = jax.tree_util.tree_flatten


class Dispatch:
    """The slow path, the locked path and the counters of one wrapper of `fun`
    (a pytree function: `_module.as_pytree_function`) with `options`."""

    def __init__(
        self, fun: Any, options: JitOptions, leading: _convention.Leading, name: str
    ) -> None:
        self.fun = fun
        self.options = options
        self.leading = leading
        self.name = name
        # capture="inputs": what methods of module arguments read from their globals,
        # told at each trace (`_capture/`: watched, or warned about where it cannot be)
        self.watch_methods: Any = (
            warn_argument_methods if options.capture == "inputs" else None
        )
        self.split = options.donates and leading.count > 0
        self.store, self.fun_dyn = store_for(fun, options)
        self.conv = _convention.convention(bool(self.store.fun_dyn_idx), self.split)
        self.seen: set[int] = set()  # module arguments of the last slow call
        self.warned: set[str] = set()  # donation warnings given (once each)
        self.hits = 0  # calls served here from compiled code (the warm path: `_warm`)
        self.misses = 0
        self.traces = 0

    def rebind(self, fun: Any) -> None:
        """`fun` again, its arrays or structure changed (a module in it was written
        to after construction): its store and arrays taken afresh."""
        self.store, self.fun_dyn = store_for(fun, self.options)
        self.conv = _convention.convention(bool(self.store.fun_dyn_idx), self.split)

    # ------------------------------------------------------------------ calls
    def call_slow(self, args: tuple, kwargs: dict) -> Any:
        """A call the warm path did not serve: flattened, then run (under the lock
        where it must be), then noted for the warm path."""
        args, kwargs = self.leading.positional(args, kwargs)
        plan, entry, dyn, statics = self.find(args, kwargs)
        if entry.cold or self.store.tracing:
            out = self.call_locked(plan, entry, dyn, args, kwargs)
        else:
            out = self.run(plan, entry, dyn, args, kwargs)
        if plan.fast is not False:
            self.note_fast(args, kwargs, plan, entry, dyn, statics)
        return out

    def run(self, plan: Plan, entry: Entry, dyn: list, args: tuple, kwargs: dict):
        """Call `entry` for `dyn` and build its output, counting a hit or a miss."""
        store = self.store
        traces = store.traces
        try:
            result = self.invoke(entry.jitted, dyn, plan)
        except BaseException as error:
            self.on_error(error)  # raises a failed `error_if` check's error
            raise
        if store.traces != traces:
            self.after_trace(args, kwargs, plan)
        else:
            self.hits += 1
        return self.output(entry, dyn, result)

    def call_locked(
        self, plan: Plan, entry: Entry, dyn: list, args: tuple, kwargs: dict
    ) -> Any:
        """`run` while holding the store's lock: until an entry's first call has
        finished, and while another thread is tracing, so that threads racing on
        a new signature trace it once (the others wait, then hit the cache)."""
        with self.store.lock:
            out = self.run(plan, entry, dyn, args, kwargs)
            entry.cold = False
        return out

    def invoke(self, jitted: Any, dyn: list, plan: Plan) -> Any:
        return _convention.call(self.conv, jitted, self.fun_dyn, dyn, plan.n_first)

    def output(self, entry: Entry, dyn: list, result: list) -> Any:
        build = entry.fast_build
        if build is not None:
            return build(result)
        return entry.output(self.fun_dyn, dyn, result)

    def on_error(self, error: BaseException) -> None:
        """After a call that raised `error`: undo what a failed trace left behind,
        then raise the [`boxwood.BoxwoodRuntimeError`][] of a failed `error_if`
        check in place of XLA's report of it."""
        restore_warnings()
        self.store.pending.__dict__.pop("n", None)
        raise_as_boxwood_error(error)

    def after_trace(self, args: tuple, kwargs: dict, plan: Plan) -> None:
        """After a call during which the store's trace count moved."""
        restore_warnings()
        mine = self.store.pending.__dict__.pop("n", 0)
        if not mine:  # `traces` moved because another thread traced meanwhile
            self.hits += 1
            return
        self.misses += 1
        self.traces += mine
        if self.options.warns_undonated:
            warn_undonated(
                args,
                kwargs,
                plan,
                name=self.name,
                donate=self.options.donate,
                skip_first=self.split,
                hidden=self.leading.labels,
                warned=self.warned,
            )

    # ------------------------------------------------------- plans and entries
    def find(self, args: tuple, kwargs: dict) -> tuple[Plan, Entry, list, tuple]:
        """`(plan, entry, dyn, statics)` of a call: its arguments flattened, their
        plan and entry found (or made)."""
        plan, statics, leaves = self.flat_plan(args, kwargs)
        if plan.get_statics is None:
            return plan, plan.only or self.entry(plan, ()), leaves, statics
        try:
            entry = plan.entries.get(plan.key_of(statics))
        except TypeError:
            raise unhashable_error(args, kwargs, plan, self.leading.labels) from None
        if entry is None:
            entry = self.entry(plan, statics)
        return plan, entry, list(plan.get_dyn(leaves)), statics

    def flat_plan(
        self, args: tuple, kwargs: dict, abstract: bool = False
    ) -> tuple[Plan, tuple, list]:
        """`(plan, statics, leaves)`: a call's arguments flattened, the plan of
        their structure and leaf types, and their static leaves. `abstract`: a
        `jax.ShapeDtypeStruct` leaf is planned as the JAX array it describes (for
        `lower`; a call takes it as a static value, as `jax.jit` would not)."""
        store = self.store
        if kwargs:
            leaves, treedef = _flatten((args, kwargs))
            plan = store.kw_plans.get(treedef)
        else:
            leaves, treedef = _flatten(args)
            plan = store.plans.get(treedef)
        planned = _abstract_as_arrays(leaves) if abstract else leaves
        types = tuple(map(type, planned))
        if plan is None or plan.types != types:
            plan = self.plan(treedef, types, planned, bool(kwargs))
        statics = plan.get_statics(leaves) if plan.get_statics is not None else ()
        return plan, statics, leaves

    def note_fast(
        self, args: tuple, kwargs: dict, plan: Plan, entry: Entry, dyn: list, statics
    ) -> None:
        """Give `(plan, entry)` a warm-path key when the arguments can be walked
        (`call_key`, `_module/_flat_key.py`). A module argument without a flat form
        gets one the second time it is seen, so that a model that changes every call
        is not flattened twice. The key is trusted only if the walk gives exactly the
        dynamic and static leaves that the real flatten gave."""
        seen, self.seen = self.seen, set()
        walked_statics: list = []
        complete = True
        for a in (*args, kwargs) if kwargs else args:
            step = remember_walkable(a, walked_statics, seen, self.seen)
            if step is False:
                plan.fast = False  # structural: no call with this plan can be fast
                return
            complete = complete and step is not None
        if not complete or entry.cold:
            return
        walked: list = []
        key = call_key(args, kwargs, walked)
        if (
            key is None
            or len(walked) != len(dyn)
            or any(a is not b for a, b in zip(walked, dyn))
            or len(walked_statics) != len(statics)
            or any(a is not b for a, b in zip(walked_statics, statics))
        ):
            plan.fast = False  # the walk disagrees with jax's flatten for these types
            return
        self.store.fast_plans[key] = (plan, entry)
        plan.fast = True

    def plan(self, treedef: Any, types: tuple, leaves: list, kw: bool) -> Plan:
        store = self.store
        with store.lock:
            plan = store.plan_variants.get((kw, treedef, types))
            if plan is None:
                plan = Plan(treedef, types, leaves, kw, self.leading.count)
                store.plan_variants[(kw, treedef, types)] = plan
            (store.kw_plans if kw else store.plans)[treedef] = plan
        return plan

    def entry(self, plan: Plan, statics: tuple) -> Entry:
        store = self.store
        with store.lock:
            key = plan.key_of(statics)
            entry = plan.only if not statics else plan.entries.get(key)
            if entry is not None:
                return entry
            entry = Entry()
            entry.jitted = self.jit(store, plan, statics, entry)
            if plan.get_statics is None:
                plan.only = entry
            else:
                plan.entries[key] = entry
        return entry

    def jit(self, store: Store, plan: Plan, statics: tuple, entry: Entry) -> Any:
        """The inner `jax.jit` of `entry`: the one place that builds one."""
        inner = traced_function(
            self.fun,
            store,
            plan,
            statics,
            entry,
            options=self.options,
            name=self.name,
            conv=self.conv,
            leading=self.leading,
            watch_methods=self.watch_methods,
        )
        return _checked_jit.checked_jit(inner, self.jit_options(plan))

    def jit_options(self, plan: Plan) -> dict[str, Any]:
        """Keyword arguments for the inner `jax.jit` of one plan.

        This is the extension point for per-leaf options: the inner function takes
        flat lists of arrays, in the order of `plan.dyn_idx`, so an option given as a
        pytree prefix of the arguments (e.g. `in_shardings`) is broadcast over the
        arguments' leaves and picked at `plan.dyn_idx` here.
        """
        options = self.options.jit_kwargs()
        options.pop("out_shardings", None)  # applied inside `inner` (_shardings.py)
        if options.get("in_shardings") is not None:
            options["in_shardings"] = _shardings.in_shardings(
                options["in_shardings"], plan, self.conv, bool(self.leading.labels)
            )
        if self.options.donates:
            options["donate_argnums"] = _convention.donate_argnums(self.conv)
        return options

    def clear(self) -> None:
        """Forget compiled code and reset the counters."""
        self.store.clear()
        self.hits = self.misses = self.traces = 0


def prepare(
    dispatch: Dispatch, args: tuple, kwargs: dict, abstract: bool = False
) -> tuple:
    """`(args, kwargs, plan, statics, dyn)` of a call, on the slow path (ahead-of-time
    lowering and its compiled calls). `abstract` (lowering): `jax.ShapeDtypeStruct`
    leaves are dynamic, in the plan that arrays of their shapes would get, and
    stay abstract in `dyn` (`jax.jit(...).lower` takes them)."""
    args, kwargs = dispatch.leading.positional(args, kwargs)
    plan, statics, leaves = dispatch.flat_plan(args, kwargs, abstract)
    return args, kwargs, plan, statics, list(plan.get_dyn(leaves))


def _abstract_as_arrays(leaves: list) -> list:
    """`leaves` with a JAX array in place of each `jax.ShapeDtypeStruct`: what a
    plan reads of a leaf is its type and whether it is an array."""
    if not any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
        return leaves
    array = _stand_in()
    return [array if isinstance(x, jax.ShapeDtypeStruct) else x for x in leaves]


@functools.cache
def _stand_in() -> jax.Array:
    return jax.numpy.zeros((), bool)
