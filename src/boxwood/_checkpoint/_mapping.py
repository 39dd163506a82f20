"""The memory map of a safetensors file, which zero-copy loads alias.

**The mapping** is private and copy-on-write (`MAP_PRIVATE`; Python's
`mmap.ACCESS_COPY`), and every view handed out is read-only. Nothing boxwood or
XLA does can then reach the file: were a loaded buffer ever written in place (XLA
reusing a donated input), the kernel copies that page for this process alone,
where a read-only shared mapping would crash it. Where the kernel refuses a
writable private mapping (strict overcommit accounting of a very large file), a
read-only shared mapping (`mmap.ACCESS_READ`) is used; for reading, the two behave
alike on Linux.

**A later write to the file.** The mapping holds the file's inode open as long as
any array aliases it, so the loaded arrays stay valid and unchanged when the file is
deleted, or replaced the way boxwood's own writers replace files (a new file
renamed over the old one: `boxwood.save`, `save_pretrained`, `Checkpointer`);
the old inode's disk space is freed when the last such array is. No mapping can
protect against a program that rewrites the same inode in place (`open(path,
"wb")`, `cp` onto the file, `safetensors.numpy.save_file`): on Linux a private
mapping's unwritten pages still show the file's current bytes, and bytes cut off
by truncation make the next read of them raise `SIGBUS`. Load with
`BOXWOOD_COPY_CHECKPOINTS=1` set when the files may be rewritten in place while
the loaded model is in use: every tensor is then copied.

A file replaced or rewritten between the reading of its header and its mapping is
detected (`file_identity` differs) and reported, never mapped.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ._error import CheckpointError
from ._format import ALIGNMENT, TensorInfo, file_identity, tensor_view


def copy_requested() -> bool:
    """Whether `BOXWOOD_COPY_CHECKPOINTS` asks for every tensor to be copied."""
    value = os.environ.get("BOXWOOD_COPY_CHECKPOINTS", "").strip().lower()
    return value in ("1", "true", "yes", "on")


def changed_while_loading(path: str) -> CheckpointError:
    return CheckpointError(f"{path}: the file changed while loading.")


class FileMapping:
    """One file's bytes, mapped on first use; shared by the file's tensors.

    The arrays returned keep the mapping alive (NumPy holds the `mmap` object as
    their base, and JAX holds an aliased NumPy array until its buffer is freed).
    """

    def __init__(self, path: str, identity: tuple[int, ...] | None) -> None:
        self.path = path
        self.identity = identity
        self._data: np.ndarray | None = None

    def data(self) -> np.ndarray:
        """The whole file as a read-only byte array."""
        if self._data is None:
            self._data = self._map()
        return self._data

    def _map(self) -> np.ndarray:
        with open(self.path, "rb") as f:
            now = file_identity(os.fstat(f.fileno()))
            if self.identity is not None and now != self.identity:
                raise changed_while_loading(self.path)
            try:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except OSError:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(mapped, np.uint8)
        data.flags.writeable = False
        return data

    def view(self, data_start: int, info: TensorInfo) -> np.ndarray:
        """A tensor as a read-only view of the mapping."""
        return tensor_view(self.data(), data_start, info)

    @staticmethod
    def can_alias(data_start: int, info: TensorInfo) -> bool:
        """Whether the tensor's data begin on an `ALIGNMENT`-byte boundary of the
        file (the mapping begins on a page), so that the device may adopt a view
        of them."""
        return (data_start + info.begin) % ALIGNMENT == 0 and info.begin != info.end

    def aligned_view(self, data_start: int, info: TensorInfo) -> np.ndarray | None:
        """The tensor as a view of the mapping if the device may adopt it
        (`can_alias`); `None` otherwise."""
        return self.view(data_start, info) if self.can_alias(data_start, info) else None
