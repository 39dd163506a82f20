"""`JitWrapper`: what `filter_jit` builds for one function and its options.

Three parts, one responsibility each:

- `_warm.py`: the per-call function the user calls (`JitWrapper.call`);
- `_dispatch.py`: `Dispatch`, everything else a call may need (the slow path that
  flattens, plans and entries, the locked path, the inner `jax.jit`, counters);
- this file: the wrapper as the user sees it (`fun`'s name and doc,
  `cache_info()`, `clear_cache()`, `lower()`), and its function's module kept
  current (`forget_flat`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from .._module import as_pytree_function, rest_on
from .._tracebacks import hiding_own_frames
from . import _aot, _convention
from ._diagnostics import restore_warnings
from ._dispatch import Dispatch, prepare
from ._options import JitOptions
from ._warm import detour, rebind, reset_hits, warm_call, warm_hits


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
    """The callable returned by [`boxwood.filter_jit`][] (its `call`)."""

    def __init__(
        self,
        fun: Callable,
        options: JitOptions,
        hidden: list[str] | None = None,
        name: str | None = None,
    ):
        self._fun = as_pytree_function(fun)
        wrapped = getattr(fun, "__func__", fun)
        self.__qualname__ = name or getattr(
            wrapped, "__qualname__", type(wrapped).__name__
        )
        leading = _convention.Leading(self._fun, hidden, options.except_first)
        self.dispatch = Dispatch(self._fun, options, leading, self.__qualname__)
        self.call = self.decorate(warm_call(self.dispatch), wrapped, self.clear_cache)
        if self.dispatch.fun_dyn:  # a bound method's module, `filter_jit(model)`
            rest_on(self, self._fun)

    def forget_flat(self) -> None:
        """A module inside the function was written to after construction (maybe
        while a trace runs): the next call takes its arrays (and maybe its
        structure) afresh, before anything else (`_refresh`)."""
        detour(self.call, self._refresh)

    def _refresh(self, args: tuple, kwargs: dict) -> Any:
        """The function's arrays and store taken afresh, given to the per-call
        function (which the user holds) in place; then this call, on the slow
        path."""
        dispatch = self.dispatch
        dispatch.rebind(self._fun)
        rebind(self.call, dispatch)
        if dispatch.fun_dyn:
            rest_on(self, self._fun)
        return dispatch.call_slow(args, kwargs)

    def decorate(
        self, call: Any, wrapped: Any, clear_cache: Callable, lower: Any = None
    ) -> Any:
        """`call` as the user sees it: `fun`'s name and doc, `cache_info()`,
        `clear_cache()`."""
        functools.update_wrapper(call, wrapped, updated=())
        call.cache_info = self.cache_info
        call.clear_cache = clear_cache
        call.lower = hiding_own_frames(lower or self.lower)
        call._boxwood_jit = self
        return call

    @property
    def _store(self) -> Any:
        return self.dispatch.store

    def cache_info(self) -> CacheInfo:
        """`(hits, misses, traces, size)` for this wrapper (see [`CacheInfo`][])."""
        d = self.dispatch
        hits = d.hits + warm_hits(self.call)
        return CacheInfo(hits, d.misses, d.traces, d.store.size)

    def clear_cache(self) -> None:
        """Forget compiled code and reset the counters."""
        self.dispatch.clear()
        reset_hits(self.call)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower for these arguments without running (see `Lowered`):
        `.lower(*args).compile()` gives a `Compiled` that takes the
        same arguments as the function and returns its output. JAX's own
        `Lowered` of the inner function (flat lists of arrays) is its `.flat`.

        **Arguments:** the arguments of a call. A `jax.ShapeDtypeStruct` leaf (as
        `filter_eval_shape` gives) stands for an array of its shape, dtype and
        sharding, as in `jax.jit(f).lower`: a model and its optimiser state can be
        compiled, and their memory read, from shapes alone.

        **Returns:** a `Lowered`, whose `compile()` gives a `Compiled`.
        """
        return self.lower_with(lambda: (), args, kwargs)

    def lower_with(self, prefix: Callable[[], tuple], args: tuple, kwargs: dict):
        """`lower`, with `prefix()` (the captured values' hidden argument) before
        the arguments, at lowering and at each call of the compiled object."""
        d = self.dispatch
        args, kwargs, plan, statics, dyn = prepare(
            d, (*prefix(), *args), kwargs, abstract=True
        )
        entry = d.entry(plan, statics)
        lowerer = _Lowerer(entry.jitted)
        try:
            flat = _convention.call(d.conv, lowerer, d.fun_dyn, dyn, plan.n_first)
        finally:
            restore_warnings()
            d.traces += d.store.pending.__dict__.pop("n", 0)
        return _aot.Lowered(flat, _aot.JitCall(d, prefix, plan, plan.key_of(statics)))


class _Lowerer:
    """Calls `jitted.lower` with the arguments of a call of `jitted`."""

    def __init__(self, jitted: Any) -> None:
        self.jitted = jitted

    def __call__(self, *args: Any) -> Any:
        return self.jitted.lower(*args)
