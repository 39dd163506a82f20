"""Background saves: the arrays are brought to host, then a thread writes the file.

Saves run one after another: a new save (or `Checkpointer` operation) first waits
for the earlier ones, and process exit waits for them too (the threads are not
daemons). An error raised in the background is kept and raised again by the
handle's `wait()`, and by the next save, so it is never lost.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_pending: list[SaveHandle] = []


class SaveHandle:
    """A save running in the background, returned by `save(..., blocking=False)`.

    `done()` says whether it finished; `wait()` blocks until it has and raises its
    error, if any. The arrays were on the host before the handle was returned
    (NumPy leaves copied; a `jax.Array`'s host view held, which JAX does not reuse
    while it is held), so the saved tree may be changed, donated or deleted right
    away.
    """

    def __init__(self, path: Any, write: Callable[[], None]):
        self.path = path
        self._error: BaseException | None = None
        self._reported = False
        self._thread = threading.Thread(
            target=self._run, args=(write,), name=f"boxwood-save {path}"
        )

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as e:  # kept and raised in the caller's thread
            self._error = e

    def done(self) -> bool:
        """Whether the save finished (successfully or not)."""
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the save finished; raise the error it met, if any.

        **Arguments:**

        - `timeout`: seconds to wait at most; `TimeoutError` if still running.
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"The background save to {self.path} is still running.")
        if self._error is not None:
            self._reported = True
            raise RuntimeError(f"The background save to {self.path} failed.") from (
                self._error
            )

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        if self.done() and self._error is not None:
            state = f"failed: {self._error!r}"
        return f"SaveHandle({str(self.path)!r}, {state})"


def start(path: Any, write: Callable[[], None]) -> SaveHandle:
    """Start `write` in the background, after the earlier saves finished."""
    wait_all()
    handle = SaveHandle(path, write)
    with _lock:
        _pending.append(handle)
    handle._thread.start()
    return handle


def wait_all() -> None:
    """Wait for every background save; raise the first error not yet raised."""
    with _lock:
        handles = list(_pending)
    failed = None
    for handle in handles:
        handle._thread.join()
        if handle._error is not None and not handle._reported and failed is None:
            failed = handle
    with _lock:
        for handle in handles:
            kept = handle._error is not None and not handle._reported
            if handle in _pending and (handle is failed or not kept):
                _pending.remove(handle)
    if failed is not None:
        failed.wait()


@atexit.register
def _at_exit() -> None:
    try:
        wait_all()
    except RuntimeError as e:
        print(f"boxwood: {e} ({e.__cause__!r})", file=sys.stderr)
