"""Leaves stored as one tensor per layer: where each tensor goes (`Part`), and a
leaf read from its tensors in one pass (`PartsTensor`).

A model that stacks its layers (`boxwood.nn.Stacked`) holds one array of shape
`(depth, *layer)` where a checkpoint holds `depth` tensors of shape `layer`
(`h.0.mlp.w` ... `h.{depth-1}.mlp.w`). `assemble(..., parts=...)` takes that
correspondence as data, a `Part` for each tensor name, validates every part as a
tensor of its own (problems name the part), and reads each such leaf once as a
`PartsTensor`: one read-only view where the parts lie back to back in a mapped
file (`stacked_view`), else one buffer of the leaf's shape and final dtype with
each part read (or cast) straight into its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np

from ._host_memory import aligned_empty
from ._safetensors import FileTensor, stacked_view


class Part(NamedTuple):
    """Where a checkpoint tensor goes: into the stored leaf named `leaf` (its
    dotted path), at `index` along the leaf's leading axes (`()`: the whole
    leaf, under another name)."""

    leaf: str
    index: tuple[int, ...] = ()


@dataclass(frozen=True)
class PartsTensor:
    """A leaf of `shape` and `dtype` read from its parts, as one tensor.

    `parts[i]` is the validated tensor of row `i` of the leaf's first `axes`
    axes (in C order); a part whose shape differs from a row's by size-1 axes
    is reshaped, and a part of another floating dtype is cast on the way in. A
    row without a part (`None`, a non-strict load) is that row of `keep`, the
    value the leaf had.
    """

    parts: tuple[Any, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    axes: int
    keep: np.ndarray | None = None

    # a read returns a fresh buffer that only the caller references, or a
    # read-only view of a file's private mapping
    reads_are_owned = True

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[self.axes :]

    def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """The whole leaf (`index=None`), or the block `index` selects (one
        device's shard: only the parts it covers are read, each only in part)."""
        if index is None:
            view = stacked_view(self.parts, self.shape, self.dtype)
            if view is not None:
                return view
            out = aligned_empty(self.shape, self.dtype)
            for i, row in enumerate(out.reshape(-1, *self.row_shape)):
                self._fill(i, row)
            return out
        lead = self.shape[: self.axes]
        rows = np.arange(len(self.parts)).reshape(lead)[index[: self.axes]]
        inner = tuple(index[self.axes :])
        pieces = [self._row(int(i), inner) for i in rows.reshape(-1)]
        out = aligned_empty(rows.shape + pieces[0].shape, self.dtype)
        for row, piece in zip(out.reshape(-1, *pieces[0].shape), pieces):
            np.copyto(row, piece, casting="unsafe")
        return out

    def fresh_nbytes(self, cast: Any) -> int | None:
        """The bytes of new memory a whole read takes (`read_region`): none for
        one mapped span, the leaf's buffer otherwise; `None` where a part is
        read into a buffer of its own first (a cast; `cast` itself is the
        final dtype already)."""
        if any(part is None or part.dtype != self.dtype for part in self.parts):
            return None
        if stacked_view(self.parts, self.shape, self.dtype) is not None:
            return 0
        return self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))

    def _fill(self, i: int, row: np.ndarray) -> None:
        part = self.parts[i]
        if (
            isinstance(part, FileTensor)
            and part.dtype == row.dtype
            and int(np.prod(part.shape, dtype=np.int64)) == row.size
        ):
            part.read_into(row)  # from the file to its place: one copy
        else:
            np.copyto(row, self._row(i, None), casting="unsafe")

    def _row(self, i: int, index: tuple[slice, ...] | None) -> np.ndarray:
        part = self.parts[i]
        if part is None:
            # a row the source lacks keeps `like`'s value (`assemble` gives
            # `keep` wherever a part is missing)
            data = cast(np.ndarray, self.keep).reshape(-1, *self.row_shape)[i]
            return data if index is None else data[index]
        if tuple(part.shape) == self.row_shape:
            return part.read(index)
        data = part.read().reshape(self.row_shape)
        return data if index is None else data[index]
