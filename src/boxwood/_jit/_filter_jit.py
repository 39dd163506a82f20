"""`filter_jit`: `jax.jit` for any mix of modules, arrays and Python objects.

How a call flows (each step is on the per-call path, so each is kept small):

1. `(args, kwargs)` is flattened once on JAX's C++ pytree path. Module configuration
   is already in the treedef.
2. The leaves' types decide which are arrays (traced) and which are static (hashed
   by value). A `Plan`, cached per treedef, holds that split; it is found by one
   dict lookup on the treedef and one tuple comparison of the leaf types.
3. Static leaves (often none) pick an `Entry`: one inner `jax.jit` over flat lists
   of arrays. Shapes and dtypes are left to `jax.jit`'s own C++ cache, so boxwood
   never computes a per-leaf signature in Python.
4. The inner function is called without blocking (asynchronous dispatch is kept).
5. Outputs are rebuilt from the returned arrays and the output structure recorded
   when the function was traced.

Tracing happens inside the inner function, so counting traces and explaining
recompiles (`_explain.py`) costs nothing on calls that do not trace.

Warm calls whose arguments carry their flat form skip steps 1-3 (`_module/_flat_key.py`):
a walk of the arguments gives a key for `Store.fast_plans` (`_warm.py`, the one
warm path; every other call goes to `_dispatch.py`).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from . import _capture, _shardings
from ._options import (
    CAPTURE_MODES,
    DONATE_MODES,
    Capture,
    Donate,
    JitOptions,
    check_jit_kwargs,
)
from ._warm import detour, warm_call
from ._wrapper import CacheInfo as CacheInfo
from ._wrapper import JitWrapper

_P = ParamSpec("_P")
_T = TypeVar("_T")


@overload
def filter_jit(
    fun: Callable[_P, _T],
    *,
    donate: Donate = "none",
    explain: bool | None = None,
    capture: Capture = "inputs",
    **jit_kwargs: Any,
) -> Callable[_P, _T]: ...


@overload
def filter_jit(
    fun: None = None,
    *,
    donate: Donate = "none",
    explain: bool | None = None,
    capture: Capture = "inputs",
    **jit_kwargs: Any,
) -> Callable[[Callable[_P, _T]], Callable[_P, _T]]: ...


def filter_jit(
    fun: Callable | None = None,
    *,
    donate: Donate = "none",
    explain: bool | None = None,
    capture: Capture = "inputs",
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
      warning when a buffer cannot be donated). A bound method's module
      (`filter_jit(model.__call__)`, `filter_jit(model)`) is donated too, as in
      Equinox: its arrays are deleted by the call, so pass the model as an
      argument instead to keep using it.
    - `explain`: `True` warns with a [`boxwood.RecompileWarning`][] on every retrace
      after the first, naming what changed; `None` follows
      `boxwood.config.explain_recompiles`.
    - `capture`: `"inputs"` (default): what `fun` reads from its globals or
      closure (directly, through the functions it calls, or inside the methods of
      modules it reads or is given) is never stale. Arrays, modules and pytrees
      of arrays are inputs, like arguments, so rebinding them is seen on the next
      call without a retrace (their arrays are never donated); every other value
      is compiled in at the trace and is part of the cache key, so rebinding it
      traces once more with the new value. `"constants"`: everything `fun` reads
      is fixed at its first trace, as with `jax.jit`. See the docs' section on
      captured values for what is followed.
    - `in_shardings`, `out_shardings`: pytree prefixes of the positional arguments
      (a tuple, one entry per argument) and of the output, with a
      `jax.sharding.Sharding`, a `jax.Device` or `None` (unspecified) at each
      leaf, e.g. `boxwood.named_shardings(model, mesh, rules)`. Outputs keep
      their sharding step after step, so donated buffers are reused.

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
    _check_options(donate, capture, jit_kwargs)
    if fun is None:
        return lambda f: filter_jit(
            f, donate=donate, explain=explain, capture=capture, **jit_kwargs
        )
    if not callable(fun):
        raise TypeError(f"`filter_jit` expects a callable, got {type(fun).__name__}.")
    return _wrap(fun, JitOptions(donate, explain, jit_kwargs, capture))


def _check_options(donate: Any, capture: Any, jit_kwargs: dict) -> None:
    """`filter_jit`'s options, checked before any function is wrapped."""
    if donate not in DONATE_MODES:
        raise ValueError(
            f"`filter_jit(donate=...)` must be one of {', '.join(map(repr, DONATE_MODES))}; "
            f"got {donate!r}."
        )
    check_jit_kwargs(jit_kwargs)
    if capture not in CAPTURE_MODES:
        raise ValueError(
            f"`filter_jit(capture=...)` must be one of "
            f"{', '.join(map(repr, CAPTURE_MODES))}; got {capture!r}."
        )
    for name in _shardings.SHARDING_KWARGS:
        _shardings.check(name, jit_kwargs.get(name))


def _wrap(fun: Callable, options: JitOptions) -> Any:
    """The callable `filter_jit(fun)` returns: the capture layer's where `fun`
    reads watched names (`_capture/`), else the wrapper's own call."""
    if options.capture == "inputs":

        def make_core(traced: _capture.Traced) -> JitWrapper:
            return JitWrapper(traced, options, traced.capture.labels)

        def make_plain(bound: Any, labels: Any, name: str) -> JitWrapper:
            return JitWrapper(bound, options, labels, name)

        # `options.key`: what the core is compiled with
        layer = _capture.wrap(fun, options.key, make_core, make_plain)
        if layer is not None:
            return layer.core.decorate(layer.call, fun, layer.clear_cache, layer.lower)
        # It reads nothing watched itself, but its module arguments' methods may
        # read globals: watched from the first trace that finds them on (a
        # callable that reaches no plain function keeps the dispatch's warning).
        core = JitWrapper(fun, options)
        promote = functools.partial(_promote, core)
        if type(fun) is types.FunctionType:
            _capture.watch_plain(fun, options.key, core, make_core, promote)
        else:
            _capture.watch_callable(fun, core, make_plain, promote)
        return core.call
    return JitWrapper(fun, options).call


def _promote(core: JitWrapper, layer: _capture.Layer) -> None:
    """Send the calls of `core`, a plain function's wrapper that the user holds, to
    `layer` (the function turned out to read watched names through the methods of
    its module arguments; this runs during `core`'s first trace). The constants
    of this trace are the capture's first (no static name): calls with them go on
    to `core`'s compiled code (a warm call of its own), the others to the layer's
    core, which inherits what `core` recorded, so that its first trace is
    explained as a recompile; `cache_info`, `clear_cache` and `lower` cover
    both."""
    call = core.call
    old, new = core.dispatch.store, layer.core.dispatch.store
    hidden = layer.state.hidden_now()  # keys the constants of the trace under way
    constants = _capture.describe_captures(hidden, layer.capture.labels)
    with new.trace_lock:
        new.records[:0] = [constants | record for record in old.records]
        new.traces += old.traces
    if hidden is None:  # (else another wrapper of the function keyed first)
        core.call = warm_call(core.dispatch)  # counted by `core.cache_info`
        layer.route_first(core.call)
    detour(call, lambda args, kwargs: layer.call(*args, **kwargs))

    def cache_info() -> CacheInfo:
        a, b = core.cache_info(), layer.core.cache_info()
        return CacheInfo(*(x + y for x, y in zip(a, b)))

    def clear_cache() -> None:
        core.clear_cache()
        layer.clear_cache()

    call.cache_info, call.clear_cache, call.lower = cache_info, clear_cache, layer.lower
    call._boxwood_jit = layer.core
