"""Crash-safe file replacement: the target is always the old file or the new one.

The new file is written to a temporary file in the target's directory, fsynced,
renamed over the target (atomic on POSIX), and the directory is fsynced so that the
rename itself survives a power cut. A process killed mid-write leaves only a
temporary file, which the next save to the same target removes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import secrets
from collections.abc import Callable, Iterator, Set
from typing import BinaryIO

from ._libc import linux_function

_TMP_INFIX = ".tmp-"


def _tmp_prefix(target: pathlib.Path) -> str:
    return f".{target.name}{_TMP_INFIX}"


def _pid_of(tmp_name: str, prefix: str) -> int | None:
    try:
        return int(tmp_name[len(prefix) :].split("-", 1)[0])
    except ValueError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(target: pathlib.Path, active: Set[str] = frozenset()) -> list[str]:
    """Remove temporary files a killed save left next to `target`.

    A temporary file is stale when the process that wrote it is gone, or when it
    is this process's and not in `active` (a save interrupted by an exception).
    **Returns:** the names removed.
    """
    prefix = _tmp_prefix(target)
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(target.parent):
            if not entry.name.startswith(prefix) or entry.name in active:
                continue
            pid = _pid_of(entry.name, prefix)
            if pid is None or pid == os.getpid() or not _alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                removed.append(entry.name)
    return removed


_SYNC_FILE_RANGE = linux_function(
    "sync_file_range",
    (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint),
    ctypes.c_int,
)
_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages; do not wait


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing `nbytes` at `offset` of the file to disk now,
    without waiting (Linux `sync_file_range`; elsewhere nothing). A large file's
    data then goes to disk while the rest is still being written, and the fsync
    at the end waits for the tail only. Durability still comes from that fsync."""
    if _SYNC_FILE_RANGE is not None and nbytes > 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory's entries: creations, renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and directory below `root`, and `root` itself."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(os.path.join(directory, name))
        fsync_path(directory)


@contextlib.contextmanager
def _tmp_file(target: pathlib.Path) -> Iterator[tuple[pathlib.Path, BinaryIO]]:
    name = f"{_tmp_prefix(target)}{os.getpid()}-{secrets.token_hex(4)}"
    tmp = target.parent / name
    f = open(tmp, "xb")
    try:
        yield tmp, f
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(target: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Write `target` crash-safely with `write(file)`.

    **Arguments:**

    - `target`: the file to create or replace.
    - `write`: called with an open binary file; writes the whole content.
    """
    target = pathlib.Path(target).absolute()
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"Cannot save to {target}: the directory {target.parent} does not exist. "
            "Create it first (`os.makedirs(directory, exist_ok=True)`)."
        )
    remove_stale_tmp(target)
    with _tmp_file(target) as (tmp, f):
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    fsync_path(target.parent)
