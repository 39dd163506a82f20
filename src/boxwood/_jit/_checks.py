"""Failed `error_if` checks on asynchronous backends.

On the CPU a compiled call runs before it returns, so a failed check's error
arrives with the call, where `filter_jit` turns it into the check's
`BoxwoodRuntimeError`. Off the CPU (a GPU, a TPU) the call returns first, and the
error would reach Python later, as JAX's own runtime error, wherever the result is
first waited for. So there each inner `jax.jit` is wrapped in `WaitingJit`: it
notes whether tracing the function traced a raising check, and if so waits for the
results inside the call, so that the error is raised there with the check's own
type and message. On the CPU the inner `jax.jit` is used as it is: the warm path
pays nothing.
"""

from __future__ import annotations

from typing import Any

import jax

from .._errors import (
    checks_traced,
    failure_mark,
    raise_as_boxwood_error,
    wait_for_checks,
)


class WaitingJit:
    """An inner `jax.jit` that waits for its results when its code holds a raising
    check (see the module docstring)."""

    __slots__ = ("jitted", "has_checks")

    def __init__(self, jitted: Any):
        self.jitted = jitted
        self.has_checks = False

    def __call__(self, *args: Any) -> Any:
        mark = failure_mark()
        traced = checks_traced()
        try:
            result = self.jitted(*args)
            if checks_traced() != traced:  # this call traced a raising check
                self.has_checks = True
            if self.has_checks:
                wait_for_checks(result)
        except BaseException as error:
            raise_as_boxwood_error(error, since=mark)
            raise
        return result

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.lower(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.jitted, name)


def for_backend(jitted: Any) -> Any:
    """`jitted` on the CPU; a `WaitingJit` of it on any other backend."""
    if jax.default_backend() == "cpu":
        return jitted
    return WaitingJit(jitted)
