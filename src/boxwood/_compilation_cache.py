"""`enable_compilation_cache`: JAX's persistent compilation cache, set to keep small
kernels too; `warn_uncached`, the warning that a traced check keeps a program out
of it."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import jax

from ._warnings import PerformanceWarning, user_stacklevel


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/boxwood/jax` (by default `~/.cache/boxwood/jax`)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "boxwood" / "jax"


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path:
    """Turn on JAX's persistent compilation cache, so that a new process (a
    restarted notebook kernel, the next run of a script) loads compiled kernels from
    disk instead of compiling them again.

    JAX's own defaults only keep computations that took over a second to compile;
    most of a model's start-up is many small kernels, so this keeps every entry:
    `jax_persistent_cache_min_compile_time_secs=0` and
    `jax_persistent_cache_min_entry_size_bytes=-1` (no size limit). Opt-in: call it
    once at the top of a notebook or script, before building the model. Entries are
    keyed by the computation, the JAX version and the device, so a stale entry is
    never used; delete the folder to reclaim the space.

    **Arguments:**

    - `path`: the cache folder; created if missing. Default:
      `$XDG_CACHE_HOME/boxwood/jax` (`~/.cache/boxwood/jax`).

    **Returns:**

    The folder used, as a `Path`.

    >>> import boxwood, tempfile
    >>> folder = boxwood.enable_compilation_cache(tempfile.mkdtemp())
    >>> folder.is_dir()
    True
    >>> boxwood.disable_compilation_cache()
    """
    folder = Path(default_cache_dir() if path is None else path).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _reset()
    return folder


def disable_compilation_cache() -> None:
    """Turn the persistent compilation cache off again (the files stay on disk).

    >>> import boxwood
    >>> boxwood.disable_compilation_cache()
    """
    jax.config.update("jax_compilation_cache_dir", None)
    _reset()


def _reset() -> None:
    # JAX decides once per process whether the cache is in use, at the first
    # compile; a notebook has usually compiled something before this call, so make
    # it decide again (a private function: skip it if a JAX version lacks it).
    try:
        from jax._src import compilation_cache
    except ImportError:  # pragma: no cover
        return
    reset = getattr(compilation_cache, "reset_cache", None)
    if reset is not None:
        reset()


_UNCACHED_WARNED = threading.Event()  # set once the warning below is given


def _persistent_cache_on() -> bool:
    config = jax.config
    on = getattr(config, "jax_enable_compilation_cache", True)
    return bool(on) and bool(getattr(config, "jax_compilation_cache_dir", None))


def warn_uncached(message: str) -> None:
    """Warn once per process when a raising check (whose text is `message`) is
    traced while JAX's persistent compilation cache is on: its host callback
    keeps the program out of the cache (JAX says so only in a debug log)."""
    if _UNCACHED_WARNED.is_set() or not _persistent_cache_on():
        return
    _UNCACHED_WARNED.set()
    check = message.split("\n", 1)[0]
    warnings.warn(
        f"A raising check is traced into this compiled program (`boxwood.error_if`: "
        f"{check!r}), and JAX does not write a program holding its host callback "
        "to the persistent compilation cache that is turned on: the program is "
        "compiled again in each new process. To have it cached, set the "
        "environment variable BOXWOOD_ON_ERROR=nan before starting Python (a "
        "failing check then fills its output with NaN, or an integer's largest "
        "value, instead of raising). (Warned once per process.)",
        PerformanceWarning,
        stacklevel=user_stacklevel(),
    )
