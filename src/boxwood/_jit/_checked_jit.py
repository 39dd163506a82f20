"""Failed `error_if` checks on asynchronous backends.

On the CPU a compiled call runs before it returns, so a failed check's error
arrives with the call, where `filter_jit` turns it into the check's
`BoxwoodRuntimeError`; the inner `jax.jit` is used as it is.

Off the CPU (a GPU, a TPU) a call returns as soon as its work is queued, and
boxwood keeps it so: it never waits for a call's results. There each inner
`jax.jit` is wrapped in `CheckedJit`, which owns the checks traced into its code
(`_errors.note_failures`). A check that fails sets the owner's `failed` from its
host callback, on XLA's thread, as soon as the device reaches it; the owner's next
call then raises the check's `BoxwoodRuntimeError` before it queues anything. A
call whose dispatch itself fails (JAX refuses inputs computed by a failed call)
raises the same error. Where the program waits first (`jax.block_until_ready`, a
conversion to NumPy, `float(loss)`), JAX raises its own runtime error there, whose
text holds `BoxwoodRuntimeError: <message>`.

`BOXWOOD_SYNC_CHECKS=1` (read when a function is first compiled) makes every call
of a function whose program holds a raising check (`checks`, set while one is
traced) wait for its results instead, so that a failed check raises from the call
that failed, as on the CPU, at the cost of the device idling between calls. A
function without checks keeps returning at once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax

from .._errors import (
    failure_mark,
    note_failures,
    raise_as_boxwood_error,
    raise_failure,
)


def sync_checks() -> bool:
    """Whether `BOXWOOD_SYNC_CHECKS` asks calls to wait for their results."""
    return os.environ.get("BOXWOOD_SYNC_CHECKS", "").strip().lower() in {
        "1",
        "true",
        "yes",
    }


class CheckedJit:
    """An inner `jax.jit` that raises the failed checks of its earlier calls (see
    the module docstring)."""

    __slots__ = ("jitted", "failed", "wait", "checks", "__weakref__")

    def __init__(self, fun: Callable, options: dict[str, Any], wait: bool = False):
        self.failed = 0  # the serial number of a failure not yet raised
        self.wait = wait
        self.checks = False  # set when a raising check is traced into a program

        @functools.wraps(fun)
        def traced(*args: Any) -> Any:
            with note_failures(self):
                return fun(*args)

        self.jitted = jax.jit(traced, **options)

    def __call__(self, *args: Any) -> Any:
        if self.failed:
            self.raise_failed()
        mark = failure_mark()
        try:
            result = self.jitted(*args)
            if self.wait and self.checks:
                jax.block_until_ready(result)
        except BaseException as error:
            if self.failed:
                self.raise_failed()
            raise_as_boxwood_error(error, since=mark)
            raise
        return result

    def raise_failed(self) -> None:
        """Raise the failure an earlier call noted (once), if nobody claimed it."""
        serial, self.failed = self.failed, 0
        raise_failure(serial)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.lower(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.jitted, name)


def checked_jit(fun: Callable, options: dict[str, Any]) -> Any:
    """`jax.jit(fun, **options)` on the CPU; a `CheckedJit` of it on any other
    backend."""
    if jax.default_backend() == "cpu":
        return jax.jit(fun, **options)
    return CheckedJit(fun, options, wait=sync_checks())
