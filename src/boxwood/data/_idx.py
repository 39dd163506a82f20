"""Reading the IDX files MNIST is distributed in (`t10k-images-idx3-ubyte.gz`, ...)."""

from __future__ import annotations

import gzip
import os
import pathlib

import numpy as np

# The third byte of an IDX header names the element type.
_IDX_DTYPES = {
    0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8",
}  # fmt: skip


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (gzipped when its name ends in `.gz`) into a NumPy array.

    **Arguments:**

    - `path`: the file, for example `t10k-labels-idx1-ubyte.gz`.

    **Returns:**

    An array with the file's shape and element type.

    **Raises:**

    `ValueError` naming the file when its header is not an IDX header or its size
    does not match the header.
    """
    path = pathlib.Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (its header is {raw[:4]!r}).")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    body = raw[4 + 4 * ndim :]
    if len(body) != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(
            f"{path}: the header promises shape {shape} of {dtype} but the file holds "
            f"{len(body)} bytes; is it truncated?"
        )
    return np.frombuffer(body, dtype).reshape(shape)


def _find(directory: pathlib.Path, stem: str) -> pathlib.Path:
    for name in (stem + ".gz", stem):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
        f"no {stem}[.gz] in {directory}: expected the MNIST IDX files "
        "(t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz, or the train-* pair)."
    )


def load_mnist(
    directory: str | os.PathLike, split: str = "t10k"
) -> tuple[np.ndarray, np.ndarray]:
    """MNIST images and labels from IDX files in `directory` (no download).

    **Arguments:**

    - `directory`: a folder holding `{split}-images-idx3-ubyte[.gz]` and
        `{split}-labels-idx1-ubyte[.gz]`.
    - `split`: `"t10k"` (the 10,000 test images) or `"train"` (60,000).

    **Returns:**

    `(images, labels)`: `float32[n, 28, 28]` scaled to `[0, 1]` and `int32[n]`.

    **Raises:**

    `FileNotFoundError` when `directory` or a file is missing; `ValueError` when the
    files are not IDX files or the two counts differ.
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory.")
    images = read_idx(_find(directory, f"{split}-images-idx3-ubyte"))
    labels = read_idx(_find(directory, f"{split}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"{directory}: expected images [n, rows, cols] and labels [n], got "
            f"{images.shape} and {labels.shape}."
        )
    return (images / np.float32(255.0)).astype(np.float32), labels.astype(np.int32)
