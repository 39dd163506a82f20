"""boxwood's own frames are left out of what JAX records and shows of the Python
stack, as JAX leaves out its own: the source locations of a lowered program
(its metadata names the user's lines, not boxwood's internals, and is smaller
to compile) and the filtered tracebacks of errors raised through JAX's API
(`JAX_TRACEBACK_FILTERING=off` shows every frame)."""

from __future__ import annotations

import importlib
import os


def exclude_own_frames() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    # JAX keeps two lists: frames left out of source locations, and out of tracebacks
    for name in ("jax._src.source_info_util", "jax._src.traceback_util"):
        try:
            register = importlib.import_module(name).register_exclusion
        except (ImportError, AttributeError):  # another JAX: nothing is left out
            continue
        register(here)


exclude_own_frames()
