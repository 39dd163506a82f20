"""A `Checkpointer` step of a tree that spans several processes: a directory
written by orbax-checkpoint, as crash-safe as a single file.

orbax writes the step under a staging name (`.step_000100.saving`; orbax itself
writes into a temporary directory and renames it when every process is done).
Then every process fsyncs the files, all wait at a barrier, process 0 renames the
staging directory to `step_000100`, fsyncs the parent directory and deletes the
steps beyond `keep`, and all wait again. So a directory named like a step is complete and on disk; a staging or
temporary directory that a killed save left behind is removed by the next save.

All processes must call the save together (orbax's rule); barriers go through
JAX's distributed client (`orbax.checkpoint.multihost`), which may be used from
the background thread of a non-blocking save.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import secrets
import shutil
from collections.abc import Callable
from typing import Any

import jax

from . import _background
from ._atomic import fsync_path, fsync_tree
from ._orbax import orbax_checkpoint, save_orbax

STAGING_SUFFIX = ".saving"
_TRASH_INFIX = ".deleting-"
_ORBAX_TMP = ".orbax-checkpoint-tmp"
_BARRIER_TIMEOUT_MS = 600_000
_saves = itertools.count()  # the same sequence on every process: barrier names


def staging_path(final: pathlib.Path) -> pathlib.Path:
    return final.parent / f".{final.name}{STAGING_SUFFIX}"


def is_leftover(name: str) -> bool:
    """Whether a directory entry is what an interrupted step save or prune left."""
    return (
        (name.startswith(".step_") and name.endswith(STAGING_SUFFIX))
        or (name.startswith(".step_") and _TRASH_INFIX in name)
        or (name.startswith(("step_", ".step_")) and _ORBAX_TMP in name)
    )


def primary() -> bool:
    """Whether this process is the one that renames and deletes step directories."""
    return jax.process_index() == 0


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        sync = orbax_checkpoint().multihost.get_barrier_sync_fn()
        sync(key=f"boxwood-checkpointer-{name}", timeout_ms=_BARRIER_TIMEOUT_MS)


def remove_dir(path: pathlib.Path) -> None:
    """Delete a step directory: renamed away first, so that a crash mid-delete
    never leaves a half-deleted directory under a step's name."""
    trash = path.parent / f".{path.name}{_TRASH_INFIX}{secrets.token_hex(4)}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def remove_leftovers(directory: pathlib.Path) -> None:
    for entry in os.scandir(directory):
        if is_leftover(entry.name):
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


def save_step(
    final: pathlib.Path,
    tree: Any,
    metadata: dict,
    blocking: bool,
    then: Callable[[], None],
) -> _background.SaveHandle | None:
    """Write `tree` to the step directory `final` (every process calls this); process
    0 calls `then` once the step is in place (pruning), before every process
    returns."""
    staging = staging_path(final)
    tag = f"{final.name}-{next(_saves)}"

    def publish() -> None:
        fsync_tree(staging)
        _barrier(f"{tag}-written")
        try:
            if primary():
                if final.exists():  # the same step saved again
                    remove_dir(final)
                os.rename(staging, final)
                fsync_path(final.parent)
                then()
        finally:  # reached even when process 0 failed: no process waits forever
            _barrier(f"{tag}-published")  # every process sees the same steps after

    return save_orbax(staging, tree, metadata=metadata, blocking=blocking, then=publish)
