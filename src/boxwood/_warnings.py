"""Warning categories of boxwood, and how they point at the user's own line."""

from __future__ import annotations

import os
import sys

import jax  # noqa: F401  (imported so that its location is known)


class RecompileWarning(UserWarning):
    """A `filter_jit` function was traced again; the message says what changed."""


class PerformanceWarning(UserWarning):
    """A usage pattern that works but is slow (e.g. re-wrapping a function in a loop)."""


class CapturedValueWarning(UserWarning):
    """A value read by a `filter_jit` function may be stale in the compiled code:
    an array that a method of a module *argument* reads from its globals, where
    the callable given to `filter_jit` takes no per-call check (a
    `functools.partial` that reads nothing watched itself), is fixed at the
    trace."""


def _package_dir(name: str) -> str:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(path) if path is not None else "\0"


_SKIP_DIRS = (os.path.dirname(__file__), _package_dir("jax"), _package_dir("jaxlib"))
_SKIP_FILES = ("contextlib.py", "functools.py", "threading.py")


def _skipped(filename: str) -> bool:
    return filename.startswith(_SKIP_DIRS) or filename.endswith(_SKIP_FILES)


def user_stacklevel() -> int:
    """The `stacklevel` that makes a warning point at the first frame outside boxwood
    and JAX (the caller's line), however deep inside a trace it is raised."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and _skipped(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level
