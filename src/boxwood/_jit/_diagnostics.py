"""What `filter_jit` says: recompile explanations, donation warnings, and errors
that name the offending argument path."""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

import jax

from .._config import config
from .._pretty import array_summary
from .._warnings import RecompileWarning, user_stacklevel
from ._capture import captured_path, describe_captures
from ._explain import describe_call, explain

if TYPE_CHECKING:
    from ._filter_jit import _JitWrapper
    from ._cache import _Plan, _Store

_DONATION_MESSAGE = "Some donated buffers were not usable"
_MAX_EXPLAIN_RECORDS = 32


def _unhashable_error(
    args: tuple, kwargs: dict, plan: _Plan, hidden: list[str] | None = None
) -> TypeError:
    keyed, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    for i in plan.static_idx:
        keys, leaf = keyed[i]
        try:
            hash(leaf)
        except TypeError:
            path, leaf = _deepest_unhashable(_user_path(keys, hidden), leaf)
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


def _user_path(keys: tuple, hidden: list[str] | None = None) -> str:
    first, second, *rest = keys
    if hidden and first.idx == 0:  # `args[0]` holds the captured values
        if second.idx == 0:
            return captured_path(rest, hidden)
        second = jax.tree_util.SequenceKey(second.idx - 1)
    head = "args" if first.idx == 0 else "kwargs"
    return head + jax.tree_util.keystr((second, *rest))


def _warn_undonated(
    wrapper: _JitWrapper, args: tuple, kwargs: dict, plan: _Plan
) -> None:
    """After a call that compiled: name the donated inputs XLA could not reuse."""
    keyed, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    start = plan.n_first if wrapper._except_first else 0
    kept = [
        f"{_user_path(keyed[i][0], wrapper._hidden)} {array_summary(keyed[i][1])}"
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


def _on_trace(
    wrapper: _JitWrapper | None, store: _Store, args: tuple, kwargs: dict
) -> None:
    with store.lock:
        store.traces += 1
        store.size += 1
        if wrapper is not None and wrapper._hidden:
            record = describe_captures(args[0], wrapper._hidden) | describe_call(
                args[1:], kwargs
            )
        else:
            record = describe_call(args, kwargs)
        previous = list(store.records)
        store.records.append(record)
        del store.records[:-_MAX_EXPLAIN_RECORDS]
    if wrapper is None:
        return
    if wrapper._donate in ("all", "all-except-first"):
        warnings.filterwarnings("ignore", message=_DONATION_MESSAGE)
        _PENDING_FILTER.filter = warnings.filters[0]
    enabled = (
        config.explain_recompiles if wrapper._explain is None else wrapper._explain
    )
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
