"""boxwood's runtime error class, and `error_if` / `branched_error_if`."""

from __future__ import annotations

import _thread
import contextlib
import itertools
import logging
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._compilation_cache import warn_uncached
from ._filters import is_array
from ._tracebacks import hiding_own_frames, user_frames
from ._unvmap import unvmap_any, unvmap_max


class BoxwoodRuntimeError(RuntimeError):
    """Raised by [`boxwood.error_if`][] when its predicate is true.

    Also available as `boxwood.EquinoxRuntimeError`. A check that fails inside
    `boxwood.filter_jit` raises this class, with your message (as Equinox's
    `filter_jit` does). Inside a plain `jax.jit`, XLA reports it as its own
    runtime error (a `RuntimeError` or `ValueError`) whose text contains
    `BoxwoodRuntimeError: <your message>`; `as_boxwood_error`
    recovers it.
    """


EquinoxRuntimeError = BoxwoodRuntimeError  # Equinox's name for the same class

_MARKER = "BoxwoodRuntimeError: "

_SITE = "The check that failed (traced inside the compiled function):"

_HINT = (
    "\n\n(raised by `boxwood.error_if` inside a compiled function. To debug: set "
    "the environment variable BOXWOOD_ON_ERROR=breakpoint to stop in a debugger "
    "where the check failed, or JAX_DISABLE_JIT=1 to run the function eagerly.)"
)


def _named(message: str, text: str) -> bool:
    """Whether a backend's report `text` names the failed check `message`: its
    own words, without the site `error_if` added (`_SITE`), which a report may
    leave out."""
    return message.split(f"\n\n{_SITE}", 1)[0] in text


class _FailedChecks:
    """The messages of the checks whose host callback raised, each with a serial
    number, until a compiled call's error claims one.

    The record makes the recovery of a failed check independent of how a backend
    words its report of a failed host callback. Callbacks run on XLA's threads and
    several threads may run compiled functions at once, so the log is guarded by a
    lock; it keeps the newest `bound` failures (a failure under a plain `jax.jit`
    is never claimed, and drops out). A record is claimed at most once, and only by
    an error that names its message, or, where the caller gives the serial number
    current when its call began (`mark`), by a report of a failed host callback
    that arrives after it."""

    def __init__(self, bound: int = 64) -> None:
        self._lock = threading.Lock()
        self._log: deque[tuple[int, str]] = deque(maxlen=bound)
        self._serials = itertools.count(1)
        self._last = 0

    def record(self, message: str) -> int:
        with self._lock:
            self._last = next(self._serials)
            self._log.append((self._last, message))
            return self._last

    def mark(self) -> int:
        return self._last  # one read of an int: atomic

    def claim(self, text: str, since: int | None) -> str | None:
        """For a `text` that reports a failed host callback: the newest recorded
        message that it contains, else (with `since`) the newest recorded after
        `since`; removed from the log. `None` if there is none."""
        if "callback" not in text.lower():
            return None
        with self._lock:
            found = next(
                (r for r in reversed(self._log) if r[1] and _named(r[1], text)), None
            )
            if found is None and since is not None:
                found = next((r for r in reversed(self._log) if r[0] > since), None)
            if found is not None:
                self._log.remove(found)
        return None if found is None else found[1]

    def take(self, serial: int) -> str | None:
        """The message of the failure numbered `serial`, removed from the log
        (`None` if it was claimed already, or dropped by the bound)."""
        with self._lock:
            for record in self._log:
                if record[0] == serial:
                    self._log.remove(record)
                    return record[1]
        return None

    def discard(self, message: str) -> None:
        """Drop the newest record of `message` (its report was recovered)."""
        with self._lock:
            for record in reversed(self._log):
                if record[1] == message:
                    self._log.remove(record)
                    return


_FAILED = _FailedChecks()


def failure_mark() -> int:
    """The serial number of the newest failed check so far: a compiled-function
    wrapper reads it before a call and passes it to `raise_as_boxwood_error` if the
    call raises, so that a failure recorded during that call can be claimed even
    when the backend's report of it carries neither the marker nor the message."""
    return _FAILED.mark()


def raise_as_boxwood_error(error: BaseException, since: int | None = None) -> None:
    """`filter_jit`'s hook for an exception raised by calling compiled code: when
    it reports a failed `error_if` check, raise the check's
    [`boxwood.BoxwoodRuntimeError`][] instead (`from None`, hiding XLA's long
    report); otherwise return, and the caller re-raises `error`. `since`: the
    `failure_mark()` read before the call, where the caller has it."""
    found = as_boxwood_error(error, since)
    if found is not None:
        raise BoxwoodRuntimeError(str(found) + _HINT) from None


def raise_failure(serial: int) -> None:
    """Raise the [`boxwood.BoxwoodRuntimeError`][] of the failed check numbered
    `serial` (see `note_failures`), unless its failure was claimed already; then
    return."""
    message = _FAILED.take(serial)
    if message is not None:
        raise BoxwoodRuntimeError(message + _HINT) from None


def as_boxwood_error(
    error: BaseException, since: int | None = None
) -> BoxwoodRuntimeError | None:
    """The [`boxwood.BoxwoodRuntimeError`][] that a failed `error_if` check raised
    inside a compiled computation, recovered from XLA's report of it (`None` if
    `error` is not such a report).

    XLA re-raises an exception from a host callback as its own runtime error (a
    `jax.errors.JaxRuntimeError`, or a `ValueError` on JAX's C++ dispatch path).
    On the CPU its text ends with the callback's traceback, and the message
    follows the last `BoxwoodRuntimeError: `. Where a backend's report lacks that
    marker, the message is the one the failed check recorded (see
    `_FailedChecks`). A compiled-function wrapper can re-raise the result
    `from None` to show the user's message alone.

    **Arguments:**

    - `error`: the exception raised by calling a compiled function.
    - `since`: `failure_mark()` as read before that call, if known.

    **Returns:**

    A `BoxwoodRuntimeError` with the original message, or `None`.
    """
    if isinstance(error, BoxwoodRuntimeError) or not isinstance(
        error, (RuntimeError, ValueError)
    ):
        return None
    text = str(error)
    if _MARKER in text:
        message = text[text.rindex(_MARKER) + len(_MARKER) :].rstrip()
        _FAILED.discard(message)  # recovered from the report itself
        return BoxwoodRuntimeError(message)
    message = _FAILED.claim(text, since)
    return None if message is None else BoxwoodRuntimeError(message)


_OWNER = threading.local()  # `current`: what notes the checks being traced


@contextlib.contextmanager
def note_failures(owner: Any) -> Iterator[None]:
    """While this thread traces in this block, each raising check traced notes its
    failure on `owner` (held weakly): when the check's host callback raises, it
    sets `owner.failed` to the failure's serial number, which `raise_failure`
    turns into the check's error, and tracing the check sets `owner.checks`. An
    enclosing block's owner is kept: a compiled function traced inside another
    belongs to the outer one's program.

    This is how a compiled function learns, without waiting for its results, that
    an earlier call of its own failed a check (`_jit/_checked_jit.py`)."""
    if getattr(_OWNER, "current", None) is not None:
        yield
        return
    _OWNER.current = weakref.ref(owner)
    try:
        yield
    finally:
        _OWNER.current = None


_ON_ERROR = ("raise", "nan", "breakpoint", "off")


def _default_on_error() -> str:
    value = os.environ.get("BOXWOOD_ON_ERROR") or os.environ.get("EQX_ON_ERROR")
    value = (value or "raise").strip().lower()
    if value not in _ON_ERROR:
        raise ValueError(
            f"The environment variable BOXWOOD_ON_ERROR (or EQX_ON_ERROR) is {value!r}; "
            f"it must be one of {', '.join(_ON_ERROR)}."
        )
    return value


def _nan_like(x: Any) -> Any:
    dtype = np.dtype(x.dtype)
    if np.issubdtype(dtype, np.inexact):
        fill = np.nan
    elif np.issubdtype(dtype, np.integer):
        fill = np.iinfo(dtype).max
    elif np.issubdtype(dtype, np.bool_):
        fill = True
    else:
        return x
    return jnp.full(jnp.shape(x), fill, dtype)


def _struct(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


class _QuietFailedChecks(logging.Filter):
    """Drops JAX's log record of a host callback that raised a failed check's
    `BoxwoodRuntimeError` (the error reaches the caller anyway, with the message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, BoxwoodRuntimeError)


_QUIET = _QuietFailedChecks()


def _with_short_traceback(error: BaseException) -> BaseException:
    """`error`, raised once on a new thread, so that its traceback ends in a frame
    with no caller.

    XLA's CPU runtime reports an exception raised in a host callback as the whole
    Python call stack above the innermost frame of its traceback, then the error:
    under a plain `jax.jit` a failed check's message came last in 1.4 KB of
    frames. Raised from a frame with no caller, the report is three lines with
    the message in the third (`test_errors.py::test_plain_jit_report_is_short`).
    """
    done = _thread.allocate_lock()
    done.acquire()

    def failed_check() -> None:
        try:
            raise error
        except BaseException:  # kept on `error.__traceback__`
            pass
        finally:
            done.release()

    try:
        _thread.start_new_thread(failed_check, ())
    except RuntimeError:  # no thread to be had: the long report, same error
        return error
    done.acquire()
    return error


def _raise_branch(leaves: list, index: Any, msgs: tuple) -> list:
    logging.getLogger("jax._src.callback").addFilter(_QUIET)  # once: a set
    warn_uncached(msgs[0])
    owner = getattr(_OWNER, "current", None)  # (see `note_failures`)
    tracing_for = None if owner is None else owner()
    if tracing_for is not None:
        tracing_for.checks = True  # its program holds a raising check

    def raises(i: Any) -> Any:
        message = msgs[int(i)]
        serial = _FAILED.record(message)
        noted = None if owner is None else owner()
        if noted is not None:
            noted.failed = serial
        raise _with_short_traceback(BoxwoodRuntimeError(message))

    return jax.pure_callback(
        raises, [_struct(x) for x in leaves], index, vmap_method="broadcast_all"
    )


def _breakpoint_branch(leaves: list, index: Any, msgs: tuple) -> list:
    def show(i: Any) -> Any:
        print(f"BoxwoodRuntimeError: {msgs[int(i)]}")
        return i

    index = jax.pure_callback(show, _struct(index), index, vmap_method="broadcast_all")
    jax.debug.breakpoint(token=index)
    return [_nan_like(x) for x in leaves]


# A custom JVP keeps the `lax.cond` out of differentiation: tangents pass straight
# through (no zeros materialised for them) and the callbacks are never differentiated.
@jax.custom_jvp
def _check(leaves: list, pred: Any, index: Any, msgs: tuple, on_error: str) -> list:
    branch = {
        "raise": _raise_branch,
        "breakpoint": _breakpoint_branch,
        "nan": lambda xs, _i, _m: [_nan_like(x) for x in xs],
    }[on_error]
    return jax.lax.cond(pred, lambda: branch(leaves, index, msgs), lambda: list(leaves))


_check = jax.custom_jvp(_check.fun, nondiff_argnums=(3, 4))


@_check.defjvp
def _check_jvp(msgs, on_error, primals, tangents):
    leaves, pred, index = primals
    return _check(leaves, pred, index, msgs, on_error), tangents[0]


def _resolve_now(x: Any, pred: Any, index: Any, msgs: tuple, on_error: str) -> Any:
    """The check when `pred` is known at trace time (`None` if it is not)."""
    if isinstance(pred, jax.core.Tracer) or isinstance(index, jax.core.Tracer):
        return None
    if not bool(pred):
        return x
    message = msgs[int(index)]
    if on_error == "raise":
        raise BoxwoodRuntimeError(message)
    if on_error == "breakpoint":
        print(f"BoxwoodRuntimeError: {message}")
        breakpoint()  # noqa: T100 (the user asked for a debugger)
        return x
    if on_error == "nan":
        warnings.warn(  # as Equinox: the NaNs are certain already, say so now
            f"`error_if` with on_error='nan': the check is known to fail when traced "
            f"({message!r}), so its output is NaN.",
            UserWarning,
            stacklevel=3,
        )
        return jax.tree_util.tree_map(lambda a: _nan_like(a) if is_array(a) else a, x)
    return x


@hiding_own_frames
def branched_error_if(
    x: Any,
    pred: Any,
    index: Any,
    msgs: Sequence[str],
    *,
    on_error: str = "default",
) -> Any:
    """As [`boxwood.error_if`][], with one of several messages chosen by `index`.

    **Arguments:**

    - `x`, `pred`, `on_error`: as for [`boxwood.error_if`][].
    - `index`: an integer (or integer array) selecting the message. Under `vmap` the
      largest index across the batch is used.
    - `msgs`: the messages.

    **Returns:**

    `x`, unchanged.

    >>> import boxwood, jax.numpy as jnp
    >>> x = jnp.array(-1.0)
    >>> boxwood.branched_error_if(x, x < 0, 1, ["too big", "negative"])
    Traceback (most recent call last):
    ...
    boxwood._errors.BoxwoodRuntimeError: negative
    """
    if on_error == "default":
        on_error = _default_on_error()
    elif on_error not in _ON_ERROR:
        raise ValueError(
            f"`on_error` must be 'default' or one of {', '.join(_ON_ERROR)}; "
            f"got {on_error!r}."
        )
    msgs = tuple(msgs)
    if not msgs or not all(isinstance(m, str) for m in msgs):
        raise TypeError(
            f"`msgs` must be a non-empty sequence of strings; got {msgs!r}."
        )
    if on_error == "off":
        return x
    pred, index = _anywhere(pred), _largest(index)
    with jax.ensure_compile_time_eval():
        done = _resolve_now(x, pred, index, msgs, on_error)
    if done is not None:
        return done
    leaves, treedef = jax.tree_util.tree_flatten(x)
    where = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
    if not where:
        raise ValueError(
            "`error_if` needs at least one array in `x` to attach the check to (the "
            "check runs when `x` is computed, and only if the result is used); got "
            f"{type(x).__name__} {x!r} with none. Pass an array the computation uses."
        )
    site = user_frames()
    if site:  # the failure names where the check was written, as a traceback would
        msgs = tuple(f"{m}\n\n{_SITE}\n{site}" for m in msgs)
    checked = _check([leaves[i] for i in where], pred, index, msgs, on_error)
    for i, value in zip(where, checked):
        leaves[i] = value
    return treedef.unflatten(leaves)


def _anywhere(pred: Any) -> Any:
    """Whether `pred` is true anywhere, in any batch element under `vmap` too. A
    value known on the host is reduced with NumPy (no JAX work)."""
    if not isinstance(pred, jax.Array):
        return np.any(pred)
    with jax.ensure_compile_time_eval():
        return unvmap_any(pred)


def _largest(index: Any) -> Any:
    """The largest message index, across a `vmap` batch too (NumPy on the host)."""
    if not isinstance(index, jax.Array):
        return np.max(index)
    with jax.ensure_compile_time_eval():
        return unvmap_max(index)


@hiding_own_frames
def error_if(x: Any, pred: Any, msg: str, *, on_error: str = "default") -> Any:
    """Raise an error if `pred` is true: at once when `pred` is known, otherwise when
    the computation runs (inside `jax.jit`, `boxwood.filter_jit`, `vmap`, `grad`...).

    **Arguments:**

    - `x`: any pytree containing at least one array; it is returned unchanged, and the
      check happens after `x` is computed and before the returned value is used.
      **If the returned value is unused, the check is removed with the dead code.**
    - `pred`: a boolean or boolean array; the error is raised if any element is true
      (under `vmap`: in any batch element).
    - `msg`: the error message.
    - `on_error`: `"raise"` (a [`boxwood.BoxwoodRuntimeError`][]), `"nan"` (return
      `x` with its floating-point arrays set to NaN, integers to their maximum),
      `"breakpoint"` (print the message and open a debugger), or `"off"`. The
      default, `"default"`, reads the environment variable `BOXWOOD_ON_ERROR` (or
      Equinox's `EQX_ON_ERROR`), falling back to `"raise"`.

    **Returns:**

    `x`, unchanged.

    Inside `boxwood.filter_jit`, in eager code and for a `pred` known at trace time,
    the error is a `BoxwoodRuntimeError`. Under a plain `jax.jit` it reaches Python as
    a `jax.errors.JaxRuntimeError` whose message contains `BoxwoodRuntimeError: <msg>`.
    On a GPU or TPU, where JAX dispatches asynchronously, a `filter_jit` call never
    waits for its results: a failed check raises its `BoxwoodRuntimeError` at the
    next call of the same function, or JAX's runtime error wherever a result is
    waited for first (`jax.block_until_ready`, a conversion to NumPy), whichever
    comes first; `BOXWOOD_SYNC_CHECKS=1` makes each call of a function holding a
    raising check wait, as on the CPU.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> @jax.jit
    ... def sqrt(x):
    ...     x = boxwood.error_if(x, x < 0, "x must be >= 0")
    ...     return jnp.sqrt(x)
    >>> sqrt(jnp.array([4.0]))
    Array([2.], dtype=float32)
    >>> boxwood.error_if(jnp.array(-1.0), jnp.array(True), "x must be >= 0")
    Traceback (most recent call last):
    ...
    boxwood._errors.BoxwoodRuntimeError: x must be >= 0
    """
    if not isinstance(msg, str):
        raise TypeError(f"`msg` must be a string; got {type(msg).__name__} {msg!r}.")
    return branched_error_if(x, pred, 0, [msg], on_error=on_error)
