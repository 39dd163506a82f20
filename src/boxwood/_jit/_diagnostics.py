"""What `filter_jit` says: recompile explanations, donation warnings, and errors
that name the offending argument path."""

from __future__ import annotations

import re
import threading
import warnings
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.core

from .._config import config
from .._filters import is_array
from .._pretty import array_summary
from .._warnings import RecompileWarning, user_stacklevel
from . import _convention
from ._capture import captured_path, describe_captures
from ._explain import NOTE_AT, describe_call, explain, in_ipython, note

if TYPE_CHECKING:
    from ._cache import Plan, Store
    from ._options import JitOptions


_DONATION_MESSAGE = "Some donated buffers were not usable"
_MAX_EXPLAIN_RECORDS = 32


def unhashable_error(
    args: tuple, kwargs: dict, plan: Plan, hidden: list[str] | None = None
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


_GROUP_REF = re.compile(r"groups\[(\d+)\]\[(\d+)\]")
_TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)


def rename_arguments(
    error: BaseException,
    conv: str,
    plan: Plan,
    args: tuple,
    kwargs: dict,
    fun: Any,
) -> None:
    """Rewrite the inner function's argument names in a JAX tracer error
    (`groups[0][3]`) as the caller's paths (`args[0].layers[1].weight`)."""
    if not isinstance(error, _TRACER_ERRORS) or not error.args:
        return
    message = error.args[0]
    if not isinstance(message, str) or "groups[" not in message:
        return
    keyed = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    own = jax.tree_util.tree_flatten_with_path(fun)[0]
    own = [k for k, leaf in own if is_array(leaf)]

    def name(match: re.Match) -> str:
        is_fun, i = _convention.position(
            conv, int(match.group(1)), int(match.group(2)), plan.n_first
        )
        try:
            if is_fun:
                keys = own[i]
                text = jax.tree_util.keystr(keys)
                return "self" + text.removeprefix(".instance")  # a bound method's
            return _user_path(keyed[plan.dyn_idx[i]][0])
        except IndexError:
            return match.group(0)

    error.args = (_GROUP_REF.sub(name, message), *error.args[1:])


def _deleted(leaf: Any) -> bool:
    """Whether `leaf` is a concrete array whose buffer is gone (a tracer, as
    under an outer `jax.vmap`, has no buffer to ask about)."""
    if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
        return False
    try:
        return leaf.is_deleted()
    except Exception:  # noqa: BLE001 (the call's own error is the one to raise)
        return False


def deleted_input(args: tuple, kwargs: dict) -> RuntimeError | None:
    """After a call failed: an error naming the first input array that was
    deleted or donated to an earlier call, or `None` where none was. (The
    backends word their own error differently, or not at all clearly: a TPU
    reports "Donation requested for invalid buffer".)"""
    try:
        keyed, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    except Exception:  # noqa: BLE001 (the call's own error is the one to raise)
        return None
    for path, leaf in keyed:
        if _deleted(leaf):
            where = _user_path(path)
            return RuntimeError(
                f"filter_jit: the input {where} ({array_summary(leaf)}) has been "
                "deleted or donated: an array given to a call that donates it "
                "belongs to that call. Pass that call's output instead, or a copy "
                "made before it (`jnp.copy`)."
            )
    return None


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
            return captured_path(tuple(rest), hidden)
        second = jax.tree_util.SequenceKey(second.idx - 1)
    head = "args" if first.idx == 0 else "kwargs"
    return head + jax.tree_util.keystr((second, *rest))


def warn_undonated(
    args: tuple,
    kwargs: dict,
    plan: Plan,
    *,
    name: str,
    donate: str,
    skip_first: bool,
    hidden: list[str] | None,
    warned: set[str],
) -> None:
    """After a call that compiled: name the donated inputs XLA could not reuse.

    `plan` says which leaves were donated; `skip_first` that the capture layer's
    hidden first argument (`plan.n_first` leaves, named by `hidden`) was not;
    `name` and `donate` are quoted in the message, given once per `warned` set
    (the caller's: one per wrapper)."""
    keyed, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    start = plan.n_first if skip_first else 0
    kept = [
        f"{_user_path(keyed[i][0], hidden)} {array_summary(keyed[i][1])}"
        for i in plan.dyn_idx[start:]
        if not (isinstance(keyed[i][1], jax.Array) and keyed[i][1].is_deleted())
    ]
    if not kept:
        return
    message = (
        "Some donated buffers were not usable: "
        f"filter_jit({name}, donate={donate!r}): {len(kept)} input buffer(s) could not be "
        f"donated (no output of the same shape and dtype could reuse them): "
        f"{', '.join(kept)}. Use donate='all' to donate without this warning, or "
        "donate='none'."
    )
    if message in warned:  # once per wrapper and message, not per trace
        return
    warned.add(message)
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


# A warnings filter pushed at the end of a successful trace with donate="all" and
# removed right after the call that traced, or when that call fails: JAX warns about
# undonatable buffers while lowering, just after the trace, and "all" means "don't
# warn" (while "warn" keeps JAX's warning). Per thread; never left installed.
_PENDING_FILTER = threading.local()


def silence_donation_warning() -> None:
    """Ignore JAX's "donated buffers were not usable" until `restore_warnings`."""
    if getattr(_PENDING_FILTER, "filter", None) is None:
        warnings.filterwarnings("ignore", message=_DONATION_MESSAGE)
        _PENDING_FILTER.filter = warnings.filters[0]


def restore_warnings() -> None:
    """Remove the filter of `silence_donation_warning`, if this thread pushed one."""
    pending = _PENDING_FILTER.__dict__.pop("filter", None)
    if pending is not None:
        try:
            cast(list, warnings.filters).remove(pending)
        except ValueError:  # already removed (e.g. by `warnings.resetwarnings`)
            pass
        # private, absent from the stubs: tells `warnings` its filters changed
        warnings._filters_mutated()  # pyright: ignore[reportAttributeAccessIssue]


def on_trace(
    options: JitOptions,
    name: str,
    store: Store,
    args: tuple,
    kwargs: dict,
    hidden: list[str] | None = None,
    own: bool = False,
) -> None:
    with store.trace_lock:  # never `store.lock` in a trace: see `Store`
        store.traces += 1
        store.size += 1
        store.pending.n = getattr(store.pending, "n", 0) + 1
        if hidden:  # `args[0]` holds the captured values (`_capture/`)
            record = describe_captures(args[0], hidden) | describe_call(
                args[1:], kwargs
            )
        else:
            record = describe_call(args, kwargs)
        previous = list(store.records)
        store.records.append(record)
        del store.records[:-_MAX_EXPLAIN_RECORDS]
    enabled = config.explain_recompiles if options.explain is None else options.explain
    # under IPython, the third compile prints a one-line note (`_explain.note`)
    # (not for boxwood's own functions, such as `generate`'s loop)
    noted = (
        store.traces == NOTE_AT and config.recompile_notes and not own and in_ipython()
    )
    if (enabled or noted) and previous:
        lines = explain(previous, record) or [
            "no difference in the arguments' structure, static values, shapes or "
            "dtypes (JAX retraced for another reason, e.g. cleared caches)"
        ]
        if noted and not enabled:
            note(name, lines)
            return
        text = "\n".join("  " + line for line in lines)
        warnings.warn(
            f"filter_jit({name}) is recompiling (trace {store.traces}; "
            f"{len(previous)} earlier signature(s)). Compared with the closest earlier "
            f"call:\n{text}",
            RecompileWarning,
            stacklevel=user_stacklevel(),
        )
