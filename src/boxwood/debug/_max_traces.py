"""`assert_max_traces` and `get_num_traces`."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from .._module import Module, field
from .._update_wrapper import module_update_wrapper

# token -> number of traces; weak, so a counter dies with the last wrapper copy.
_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Token:
    """The identity of one `assert_max_traces` wrapper, shared by its copies."""

    __slots__ = ("__weakref__",)


class _MaxTraces(Module):
    fn: Callable
    max_traces: int | None = field(static=True)
    token: _Token = field(static=True)

    @property
    def __wrapped__(self) -> Callable:
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        count = _COUNTS[self.token] = _COUNTS[self.token] + 1
        if self.max_traces is not None and count > self.max_traces:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            raise RuntimeError(
                f"`{name}` can only be traced {self.max_traces} times "
                f"(`assert_max_traces`), but this is trace number {count}. Something "
                "in its arguments changes between calls: a shape, a dtype, or a "
                "non-array value. Set `boxwood.config.explain_recompiles = True` to "
                "have `filter_jit` name it."
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
    token = _Token()
    _COUNTS[token] = 0
    return module_update_wrapper(_MaxTraces(fn, max_traces, token))


def get_num_traces(fn: Callable) -> int:
    """How many times the [`boxwood.debug.assert_max_traces`][] wrapper inside `fn`
    (looked for through `__wrapped__`) has been traced.

    **Arguments:**

    - `fn`: the wrapper, or a function wrapping it (such as a `filter_jit` of it).

    **Returns:**

    The number of traces so far.
    """
    seen = fn
    while seen is not None:
        if isinstance(seen, _MaxTraces):
            return _COUNTS[seen.token]
        seen = getattr(seen, "__wrapped__", None)
    raise ValueError(
        f"`get_num_traces`: {fn!r} is not wrapped with `boxwood.debug.assert_max_traces` "
        "(found none through its `__wrapped__` chain)."
    )
