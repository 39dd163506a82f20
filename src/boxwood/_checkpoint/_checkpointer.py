"""`Checkpointer`: numbered checkpoints in a directory, the newest `keep` kept."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import warnings
from typing import Any

from . import _background
from ._api import load, save_file
from ._error import CheckpointError
from ._format import read_header
from ._save_load import decode_user_metadata

_NAME = re.compile(r"^step_(\d+)\.safetensors$")


class Checkpointer:
    """Saves `step_000100.safetensors` files in a directory and resumes from the
    newest valid one.

    ```python
    ckpt = boxwood.Checkpointer("runs/exp1", keep=3)
    start = 0
    if ckpt.latest_step() is not None:
        start = ckpt.latest_step()
        model, opt_state = ckpt.restore((model, opt_state))
    for step in range(start, num_steps):
        model, opt_state = train_step(model, opt_state, batch)
        if step % 100 == 0:
            ckpt.save(step, (model, opt_state), blocking=False)
    ckpt.wait()
    ```
    """

    def __init__(self, directory: str | os.PathLike, keep: int | None = None):
        """**Arguments:**

        - `directory`: where the checkpoints go (created if needed).
        - `keep`: how many of the newest checkpoints to keep; `None` keeps all.
        """
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"`keep` must be a positive int or None, got {keep!r}.")
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def path(self, step: int) -> pathlib.Path:
        """The file of checkpoint `step`."""
        return self.directory / f"step_{step:06d}.safetensors"

    def all_steps(self) -> list[int]:
        """The steps of the checkpoint files present, oldest first."""
        _background.wait_all()
        return self._steps()

    def _steps(self) -> list[int]:
        names = os.listdir(self.directory)
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def save(
        self,
        step: int,
        tree: Any,
        *,
        metadata: dict | None = None,
        blocking: bool = True,
    ) -> _background.SaveHandle | None:
        """Save `tree` as checkpoint `step`, then delete all but the newest `keep`.

        **Arguments:**

        - `step`: a non-negative int naming the checkpoint.
        - `tree`: the tree to save (e.g. `(model, opt_state)`).
        - `metadata`: JSON-serialisable dict stored with it; `"step"` is added.
        - `blocking`: as in [`boxwood.save`][].

        **Returns:** `None`, or a [`boxwood.SaveHandle`][] when not blocking.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"`step` must be a non-negative int, got {step!r}.")
        _background.wait_all()
        metadata = {**(metadata or {}), "step": step}
        return save_file(self.path(step), tree, metadata, blocking, then=self._prune)

    def _prune(self) -> None:
        if self.keep is None:
            return
        for step in self._steps()[: -self.keep]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(step))

    def latest_step(self) -> int | None:
        """The newest step whose file is a complete checkpoint, or `None`.

        A file that is damaged (truncated, corrupted) is skipped with a warning.
        """
        for step in reversed(self.all_steps()):
            try:
                read_header(self.path(step))
            except CheckpointError as e:
                warnings.warn(f"Skipping a damaged checkpoint: {e}", stacklevel=2)
                continue
            return step
        return None

    def restore(
        self, like: Any, step: int | None = None, *, strict: bool = True, dtype: Any = None
    ) -> Any:
        """Load checkpoint `step` (default: the newest valid one) into `like`.

        **Arguments:** `like`, `strict`, `dtype` as in [`boxwood.load`][];
        `step`: which checkpoint.

        **Returns:** the loaded tree. **Raises** `CheckpointError` if there is none.
        """
        return load(self._resolve(step), like, strict=strict, dtype=dtype)

    def read_metadata(self, step: int | None = None) -> dict:
        """The metadata of checkpoint `step` (default: the newest valid one)."""
        path = self._resolve(step)
        return decode_user_metadata(str(path), read_header(path))

    def _resolve(self, step: int | None) -> pathlib.Path:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(
                    f"{self.directory}: no checkpoint to restore (no complete "
                    "step_*.safetensors file). Check `latest_step()` first."
                )
        return self.path(step)

    def wait(self) -> None:
        """Wait for the background saves; raise the error of a failed one."""
        _background.wait_all()

    def __repr__(self) -> str:
        return f"Checkpointer({str(self.directory)!r}, keep={self.keep})"
