"""boxwood's frames are left out of what JAX records and shows of the Python
stack, as JAX leaves out its own: the source locations of a lowered program
(its metadata names the user's lines, not boxwood's internals, and is smaller
to compile) and the filtered tracebacks of errors raised through JAX's API.

JAX filters a traceback at its own API boundary (the `jax.jit` call), below which
every frame is its own or the user's; boxwood's frames above that boundary
(`filter_jit`'s dispatch, a filtered transformation's wrapper) are hidden by
`hide_own_frames`, called in the `except` clause of each function a user calls.
It follows JAX's setting `JAX_TRACEBACK_FILTERING` (`jax_traceback_filtering`):
`off` shows every frame; under IPython the frames are marked
`__tracebackhide__` (IPython's and pytest's convention: a debugger can still
step into them); elsewhere they are removed.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import linecache
import os
import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

import jax

_HERE = os.path.dirname(os.path.abspath(__file__))
_PREFIX = _HERE + os.sep
# generated code named outside the package: the output builders (`_module/_flat_build.py`)
_GENERATED = "<boxwood "


def exclude_own_frames() -> None:
    # JAX keeps two lists: frames left out of source locations (public through
    # `jax.extend`), and out of tracebacks (in `jax._src` only)
    for names in (
        ("jax.extend.source_info_util", "jax._src.source_info_util"),
        ("jax._src.traceback_util",),
    ):
        for name in names:
            try:
                register = importlib.import_module(name).register_exclusion
            except (ImportError, AttributeError):  # another JAX: try the next
                continue
            register(_HERE)
            break


def is_own_file(filename: str) -> bool:
    """Whether code named `filename` is boxwood's own (its package, or code it
    generates)."""
    return filename.startswith((_PREFIX, _GENERATED))


def _mode() -> str:
    """JAX's traceback filtering mode, `auto` resolved as JAX resolves it."""
    mode = getattr(jax.config, "jax_traceback_filtering", "auto") or "auto"
    if mode == "auto":
        ipython = getattr(builtins, "get_ipython", None) is not None
        return "tracebackhide" if ipython else "quiet_remove_frames"
    return mode


def hide_own_frames(error: BaseException) -> None:
    """Hide boxwood's frames in `error`'s traceback, as JAX hides its own.

    Called in the `except` clause of a function the user calls, which then
    re-raises with a bare `raise` (that adds no frame): the frames from that
    function down are all in the traceback by then. Safe to call again on the
    way up (an enclosing boxwood call hides what was added since).

    **Arguments:**

    - `error`: the exception being handled.
    """
    mode = _mode()
    if mode == "off":
        return
    tb = error.__traceback__
    if mode == "tracebackhide":
        _mark(error)
        return
    kept: list[types.TracebackType] = []
    removed = False
    while tb is not None:
        if is_own_file(tb.tb_frame.f_code.co_filename):
            removed = True
        else:
            kept.append(tb)
        tb = tb.tb_next
    if not removed:
        return
    out = None
    for old in reversed(kept):
        out = types.TracebackType(out, old.tb_frame, old.tb_lasti, old.tb_lineno)
    # (no note of boxwood's own is added, unlike JAX's: a note is part of the text
    # that `pytest.raises(match=...)` reads, and the user's own errors pass here)
    error.with_traceback(out)


_JAX = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
_MAX_SITE_FRAMES = 8


def _jit_boundary() -> str | None:
    """The file of JAX's `jit` machinery, where a compiled function's trace
    starts (`None` if this JAX has none by that name)."""
    module = sys.modules.get("jax._src.pjit")
    return getattr(module, "__file__", None)


def user_frames() -> str:
    """The user's frames on the stack inside the compiled function being traced,
    outermost first, formatted as a traceback's lines ("" when there are none):
    where a check traced now was written (`error_if`). boxwood's and JAX's frames
    are left out; the walk stops where `jax.jit` began tracing (or after a few
    frames)."""
    boundary = _jit_boundary()
    frame: types.FrameType | None = sys._getframe(1)
    found: list[tuple[str, int, str]] = []
    while frame is not None and len(found) < _MAX_SITE_FRAMES:
        name = frame.f_code.co_filename
        if name == boundary:
            break
        if not (
            is_own_file(name) or name.startswith(_JAX) or name.startswith("<frozen")
        ):
            found.append((name, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    lines = []
    for name, lineno, function in reversed(found):
        lines.append(f'  File "{name}", line {lineno}, in {function}')
        source = linecache.getline(name, lineno).strip()
        if source:
            lines.append(f"    {source}")
    return "\n".join(lines)


def _mark(error: BaseException) -> None:
    """Mark boxwood's frames in `error`'s traceback `__tracebackhide__`. IPython
    shows the innermost frame even so: a run of boxwood's frames at the inner end
    (where boxwood raised the error) is removed instead."""
    tb, last_user = error.__traceback__, None
    while tb is not None:
        if is_own_file(tb.tb_frame.f_code.co_filename):
            tb.tb_frame.f_locals["__tracebackhide__"] = True
        else:
            last_user = tb
        tb = tb.tb_next
    if last_user is None:
        error.with_traceback(None)
    else:
        last_user.tb_next = None


_F = TypeVar("_F", bound=Callable)


def hiding_own_frames(fun: _F) -> _F:
    """`fun`, hiding boxwood's frames of the errors it raises (`hide_own_frames`):
    for entry points off the warm path (`lower`, the filtered transformations).
    The frame it adds is boxwood's, hidden too."""

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fun(*args, **kwargs)
        except Exception as error:
            hide_own_frames(error)
            raise

    return cast(_F, call)


exclude_own_frames()
