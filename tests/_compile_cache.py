"""One persistent XLA compilation cache for the fresh processes a test run starts.

The docs pages that need several devices, the notebooks and the Equinox examples
each run in a fresh process (a subprocess or a Jupyter kernel), which would compile
again what another one compiled a moment before: the chunk kernels of
`boxwood._init`, the same small models' layers, `generate`'s loop. Giving them
one JAX persistent compilation cache folder for the whole test run (shared by the
`pytest -n` workers: named by xdist's run id) lets each load what an earlier one
compiled. Results are unchanged: the cache holds compiled programs keyed by the
program, the JAX version and the backend. The test process itself does not use
it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import time
import uuid

_PREFIX = "boxwood-tests-xla-cache-"
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
_STALE_AFTER_S = 6 * 3600


def folder() -> pathlib.Path:
    """This test run's cache folder (made on first use; folders of runs that
    ended hours ago are removed then)."""
    path = pathlib.Path(tempfile.gettempdir()) / f"{_PREFIX}{_RUN}"
    if not path.exists():
        for old in path.parent.glob(f"{_PREFIX}*"):
            try:
                if time.time() - old.stat().st_mtime > _STALE_AFTER_S:
                    shutil.rmtree(old, ignore_errors=True)
            except OSError:
                pass
        path.mkdir(exist_ok=True)
    return path


def variables() -> dict[str, str]:
    """The environment variables that point a new JAX process at the cache, small
    programs included."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(folder()),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
