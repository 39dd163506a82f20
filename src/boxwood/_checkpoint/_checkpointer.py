"""`Checkpointer`: numbered checkpoints in a directory, the newest `keep` kept."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import warnings
from typing import Any

from . import _background
from ._error import CheckpointError
from ._format import read_header
from ._load import load
from ._safetensors import decode_user_metadata
from ._save import check_format, save_file, wants_orbax

_FILE = re.compile(r"^step_(\d+)\.safetensors$")
_DIR = re.compile(r"^step_(\d+)$")  # a tree that spans processes: orbax


class Checkpointer:
    """Saves `step_000100.safetensors` files in a directory and resumes from the
    newest valid one.

    A tree that spans several processes (sharded over the devices of several
    hosts) is saved as a directory `step_000100` written by orbax-checkpoint
    (install `boxwood[orbax]`); every process calls `save`, `latest_step` and
    `restore` together, and process 0 deletes the old steps. A step directory is
    as crash-safe as a file: it gets its name only once every process's part is
    written and fsynced.

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

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int | None = None,
        *,
        format: str | None = None,
    ):
        """**Arguments:**

        - `directory`: where the checkpoints go (created if needed).
        - `keep`: how many of the newest complete checkpoints to keep; `None`
          keeps all. A damaged checkpoint file (truncated, corrupted) or an empty
          step directory does not count, so it never costs an older complete
          one.
        - `format`: `"safetensors"` (a file per step), `"orbax"` (a directory per
          step), or `None` (default) to choose orbax exactly when the saved tree
          spans several processes, as [`boxwood.save`][] does.
        """
        if keep is not None and (
            isinstance(keep, bool) or not isinstance(keep, int) or keep < 1
        ):
            raise ValueError(f"`keep` must be a positive int or None, got {keep!r}.")
        check_format(format)
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.format = format

    def path(self, step: int) -> pathlib.Path:
        """Where checkpoint `step` is: its directory if it was saved as one (a tree
        that spans processes), otherwise its `.safetensors` file."""
        folder = self._dir(step)
        return folder if folder.is_dir() else self._file(step)

    def _file(self, step: int) -> pathlib.Path:
        return self.directory / f"step_{step:06d}.safetensors"

    def _dir(self, step: int) -> pathlib.Path:
        return self.directory / f"step_{step:06d}"

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints present (files or step directories), oldest
        first."""
        _background.wait_all()
        return self._steps()

    def _steps(self) -> list[int]:
        steps = set()
        for entry in os.scandir(self.directory):
            pattern = _DIR if entry.is_dir() else _FILE
            match = pattern.match(entry.name)
            if match:
                steps.add(int(match.group(1)))
        return sorted(steps)

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
        if wants_orbax(tree, self.format):
            from ._orbax_step import save_step

            def then() -> None:
                self._prune(step, saved_dir=True)

            return save_step(self._dir(step), tree, metadata, blocking, then)
        return save_file(
            self._file(step), tree, metadata, blocking, then=lambda: self._prune(step)
        )

    def _prune(self, saved: int, saved_dir: bool = False) -> None:
        """After saving step `saved`: remove its other form (a file where a
        directory was saved, or the other way round), the steps beyond `keep`, and
        what interrupted directory saves left."""
        from ._orbax_step import remove_dir, remove_leftovers

        def remove(step: int) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._file(step))
            if self._dir(step).is_dir():
                remove_dir(self._dir(step))

        if saved_dir:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._file(saved))
        elif self._dir(saved).is_dir():
            remove_dir(self._dir(saved))
        if self.keep is not None:
            # the newest `keep` complete steps stay; a damaged step does not count
            # (it cannot be restored), and stays only while it is newer than the
            # oldest step kept, for inspection (`latest_step` skips it)
            kept = 0
            for step in reversed(self._steps()):
                if kept == self.keep:
                    remove(step)
                elif step == saved or self._complete(step):
                    kept += 1
        remove_leftovers(self.directory)

    def _complete(self, step: int) -> bool:
        """Whether step `step` counts toward `keep`: a file whose header reads, or a
        step directory that is not empty. Local checks only: this runs on process
        0 alone, where orbax's own metadata read would wait for the other
        processes (a step directory is complete by construction: it is renamed
        into place after every process has written its part)."""
        path = self.path(step)
        if path.is_dir():
            return any(path.iterdir())
        try:
            read_header(path)
        except CheckpointError:
            return False
        return True

    def latest_step(self) -> int | None:
        """The newest step whose file is a complete checkpoint, or `None`.

        A file that is damaged (truncated, corrupted) is skipped with a warning.
        """
        for step in reversed(self.all_steps()):
            try:
                self._check(self.path(step))
            except CheckpointError as e:
                warnings.warn(f"Skipping a damaged checkpoint: {e}", stacklevel=2)
                continue
            return step
        return None

    def restore(
        self,
        like: Any,
        step: int | None = None,
        *,
        strict: bool = True,
        dtype: Any = None,
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
        if path.is_dir():
            from ._orbax import read_orbax_metadata

            return read_orbax_metadata(path)
        return decode_user_metadata(str(path), read_header(path))

    @staticmethod
    def _check(path: pathlib.Path) -> None:
        """Raise `CheckpointError` unless `path` is a complete checkpoint (its
        header, or its orbax metadata and boxwood's item, can be read)."""
        if path.is_dir():
            from ._orbax import item_metadata

            item_metadata(str(path))
        else:
            read_header(path)

    def _resolve(self, step: int | None) -> pathlib.Path:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(
                    f"{self.directory}: no checkpoint to restore (no complete "
                    "step_*.safetensors file or step_* directory). Check "
                    "`latest_step()` first."
                )
        return self.path(step)

    def wait(self) -> None:
        """Wait for the background saves; raise the error of a failed one."""
        _background.wait_all()

    def __repr__(self) -> str:
        fmt = "" if self.format is None else f", format={self.format!r}"
        return f"Checkpointer({str(self.directory)!r}, keep={self.keep}{fmt})"
