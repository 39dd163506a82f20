"""`boxwood.info()`: which per-call path is active, and the notice when the C
extension is missing."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from . import _native
from ._config import env_flag
from ._warnings import PerformanceWarning

PURE_PYTHON_NOTICE = (
    "boxwood runs on its pure-Python path: the C extension `boxwood._native._speedups` is "
    "not built (no C compiler at install time?). Everything works; warm "
    "`filter_jit` calls cost about 1.4x more for the smallest models. Reinstall "
    "with a C compiler to build it, or set BOXWOOD_PURE_PYTHON=1 to choose this "
    "path and silence this notice."
)


def info() -> dict[str, Any]:
    """Which of boxwood's per-call paths is active, and the versions in use.

    **Returns:**

    A dict with `version` (boxwood's), `jax` (JAX's), `speedups` (`True` when the C
    extension runs `filter_jit`'s warm calls), `path` (`"C extension"` or
    `"pure Python"`) and `reason` (why that path: `"built"`,
    `"BOXWOOD_PURE_PYTHON=1"` or `"not built"`). Creates no array and touches no
    device.

    >>> import boxwood
    >>> sorted(boxwood.info())
    ['jax', 'path', 'reason', 'speedups', 'version']
    """
    import jax

    from ._version import __version__

    active = _native.active()
    if active:
        reason = "built"
    elif env_flag("BOXWOOD_PURE_PYTHON"):
        reason = "BOXWOOD_PURE_PYTHON=1"
    else:
        reason = "not built"
    return {
        "version": __version__,
        "jax": jax.__version__,
        "speedups": active,
        "path": "C extension" if active else "pure Python",
        "reason": reason,
    }


def _running_the_demo() -> bool:
    """Whether this process is `boxwood-demo` or `python -m boxwood.demo`: there the
    importing line is boxwood's launcher, not the user's code, and the demo prints
    the path in its first line instead."""
    launcher = os.path.basename(sys.argv[0]) if sys.argv else ""
    if launcher.removesuffix(".exe") == "boxwood-demo":
        return True
    args = list(getattr(sys, "orig_argv", ()))
    return any(a == "-m" and b == "boxwood.demo" for a, b in zip(args, args[1:]))


def notice_pure_python() -> None:
    """Warn once, at import, when the C extension is missing and nobody chose the
    pure-Python path (a `boxwood.PerformanceWarning`, so it can be filtered). The
    warning points at the line that imports boxwood (stacklevel 3: this function,
    boxwood's `__init__`, then the importer; the import machinery's frames are
    skipped by `warnings`)."""
    if _native.active() or env_flag("BOXWOOD_PURE_PYTHON") or _running_the_demo():
        return
    warnings.warn(PURE_PYTHON_NOTICE, PerformanceWarning, stacklevel=3)
