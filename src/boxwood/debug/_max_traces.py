"""`assert_max_traces` and `get_num_traces`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .._module import Module, field
from .._update_wrapper import module_update_wrapper


class _Tally:
    """A mutable count of traces, held as a static field so that every copy of a
    wrapper (each flatten and unflatten makes one) adds to the same count. Equal
    only to itself, so it never makes two wrappers' structures equal."""

    __slots__ = ("traces",)

    def __init__(self) -> None:
        self.traces = 0


class _MaxTraces(Module):
    fn: Callable
    limit: int | None = field(static=True)
    tally: _Tally = field(static=True)

    @property
    def __wrapped__(self) -> Callable:
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.tally.traces += 1
        if self.limit is not None and self.tally.traces > self.limit:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            raise RuntimeError(
                f"`{name}` can only be traced {self.limit} times "
                f"(`assert_max_traces`), but this is trace number "
                f"{self.tally.traces}. Something in its arguments changes between "
                "calls: a shape, a dtype, or a non-array value. Set "
                "`boxwood.config.explain_recompiles = True` to have `filter_jit` "
                "name it."
            )
        return self.fn(*args, **kwargs)


def assert_max_traces(fn: Callable | None = None, *, max_traces: int | None) -> Any:
    """Wrap `fn` so that it raises if it is called (traced) more than `max_traces`
    times; place it inside `jax.jit` / `filter_jit` to guard against recompiling.

    **Arguments:**

    - `fn`: the callable. Usable as `@assert_max_traces(max_traces=1)`.
    - `max_traces`: the allowed number of calls, or `None` for any (the count is then
      still available from [`boxwood.debug.get_num_traces`][]). Keyword-only.

    **Returns:**

    The wrapped callable; calling it more than `max_traces` times raises a
    `RuntimeError`.

    >>> import boxwood, jax.numpy as jnp
    >>> @boxwood.filter_jit
    ... @boxwood.debug.assert_max_traces(max_traces=1)
    ... def f(x):
    ...     return x + 1
    >>> _ = f(jnp.ones(2)); _ = f(jnp.zeros(2))
    >>> boxwood.debug.get_num_traces(f)
    1
    """
    if fn is None:
        return functools.partial(assert_max_traces, max_traces=max_traces)
    return module_update_wrapper(_MaxTraces(fn, max_traces, _Tally()))


def get_num_traces(fn: Callable) -> int:
    """How many times the [`boxwood.debug.assert_max_traces`][] wrapper inside `fn`
    (looked for through `__wrapped__`) has been traced.

    **Arguments:**

    - `fn`: the wrapper, or a function wrapping it (such as a `filter_jit` of it).

    **Returns:**

    The number of traces so far.
    """
    layer: Any = fn
    while not isinstance(layer, _MaxTraces):
        layer = getattr(layer, "__wrapped__", None)
        if layer is None:
            raise ValueError(
                f"`get_num_traces`: {fn!r} is not wrapped with "
                "`boxwood.debug.assert_max_traces` (found none through its "
                "`__wrapped__` chain)."
            )
    return layer.tally.traces
