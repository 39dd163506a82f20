"""The safetensors file format: its header, its dtype names, reading and writing.

A file is an 8-byte little-endian header length, a JSON header naming every tensor
(`{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}}`, plus a
`"__metadata__"` map of strings), then the tensors' bytes, C-ordered and
little-endian. Files written here are read by the `safetensors` library and the
other way round (`test_interop_with_the_safetensors_library` in
tests/checkpoint/test_checkpoint_safetensors.py checks both directions). The format is written
here rather than through `safetensors.numpy` so that arrays go to the file without
an intermediate copy, the file can be fsynced before it replaces the old one, and a
sharded load reads only the slices each device needs. The files written here have
their data 64-byte aligned (`ALIGNMENT`, `data_order`), so that a load can map them
instead of reading them (`_mapping`); the format allows any header padding and any
order of the tensors' bytes.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from ._error import CheckpointError

_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
# A header larger than this is not a checkpoint (safetensors uses the same bound).
_MAX_HEADER = 100_000_000


def dtype_name(dtype: Any) -> str:
    """The safetensors name of a NumPy dtype (`float32` -> `"F32"`)."""
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
    try:
        return _NAMES[dtype]
    except KeyError:
        raise CheckpointError(
            f"dtype {dtype} cannot be stored in a safetensors file; supported: "
            f"{', '.join(str(d) for d in _NAMES)}. Cast it (`x.astype(...)`) first."
        ) from None


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in a file: dtype, shape and byte range of its data."""

    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    def describe(self) -> str:
        return describe(self.dtype, self.shape)


def describe(dtype: Any, shape: tuple[int, ...]) -> str:
    """`f32[64,32]`: a dtype and shape in the short form messages use."""
    dtype = np.dtype(dtype)
    short = {"f": "f", "i": "i", "u": "u", "b": "bool", "c": "c"}.get(dtype.kind)
    name = "bf16" if dtype == _DTYPES["BF16"] else None
    if name is None and short is not None and dtype.kind != "b":
        name = f"{short}{dtype.itemsize * 8}"
    name = name or ("bool" if dtype.kind == "b" else str(dtype))
    return f"{name}[{','.join(str(d) for d in shape)}]"


@dataclass(frozen=True)
class Header:
    """A parsed header: tensors by name, the string metadata, where data begins,
    and the identity of the file it was read from (`file_identity`)."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    identity: tuple[int, ...] | None = None


def file_identity(stat: os.stat_result) -> tuple[int, ...]:
    """Device, inode, size and modification time: a file replaced (renamed over)
    or rewritten since differs in one of them."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


# Boundary of the data section and of every tensor whose size allows it: XLA's CPU
# client adopts a host buffer that starts on a 64-byte boundary without copying it,
# so such a tensor of a mapped file becomes a device array with no read at all.
ALIGNMENT = 64


# An integer component of a dotted tensor name: a layer's index in a stack of them.
_LAYER_INDEX = re.compile(r"(?:^|(?<=\.))\d+(?=\.|$)")


def _by_stack(arrays: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """`arrays` with the tensors whose names differ only in their integer
    components (one parameter of each layer: `h.0.mlp.w`, `h.1.mlp.w`, ...) made
    consecutive, in the order of those integers, where the first of them was."""
    groups: dict[str, list[tuple[tuple[int, ...], str, np.ndarray]]] = {}
    for name, array in arrays:
        indices = tuple(int(i) for i in _LAYER_INDEX.findall(name))
        groups.setdefault(_LAYER_INDEX.sub("#", name), []).append(
            (indices, name, array)
        )
    return [
        (name, array)
        for members in groups.values()
        for _, name, array in sorted(members, key=lambda member: member[0])
    ]


def data_order(arrays: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """The order of the tensors' bytes in a file.

    Each parameter's layers are consecutive and in layer order (`_by_stack`), so
    that a model that stacks its layers (`boxwood.nn.Stacked`) finds each stacked
    array as one span of the file, which it can map rather than copy. Every
    tensor whose size is a multiple of `ALIGNMENT` comes first, so each of them
    (and each such span) begins on such a boundary, then the others by decreasing
    item size, so each still begins on a multiple of its own item size.

    The safetensors library rejects a file with bytes between two tensors, so the
    order is the only freedom: in practice every weight (a multiple of 16 elements)
    is in the first group.
    """
    arrays = _by_stack(arrays)
    whole = [(n, a) for n, a in arrays if a.nbytes % ALIGNMENT == 0]
    rest = [(n, a) for n, a in arrays if a.nbytes % ALIGNMENT != 0]
    return whole + sorted(rest, key=lambda pair: -pair[1].dtype.itemsize)


def encode_header(
    arrays: list[tuple[str, np.ndarray]], metadata: dict[str, str]
) -> bytes:
    """The header bytes (length prefix included) for `arrays`: entries in the given
    order, data laid out in `data_order`, the header padded with spaces so that the
    data begin on an `ALIGNMENT`-byte boundary of the file."""
    offsets = {}
    offset = 0
    for name, array in data_order(arrays):
        offsets[name] = (offset, offset + array.nbytes)
        offset += array.nbytes
    entries: dict[str, Any] = {"__metadata__": metadata}
    for name, array in arrays:
        entries[name] = {
            "dtype": dtype_name(array.dtype),
            "shape": list(array.shape),
            "data_offsets": list(offsets[name]),
        }
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGNMENT)
    return struct.pack("<Q", len(text)) + text


# With `writeback`, the kernel is asked to start writing every this many bytes.
WRITEBACK_CHUNK = 32 * 2**20


def write_arrays(
    f: BinaryIO,
    arrays: list[tuple[str, np.ndarray]],
    meta: dict,
    writeback: Callable[[int, int, int], None] | None = None,
) -> None:
    """Write a whole safetensors file to the open binary file `f` (tensors laid
    out as `encode_header` says).

    **Arguments:** `writeback(fd, offset, nbytes)`, if given, is called after each
    `WRITEBACK_CHUNK` bytes have been handed to the kernel (to start their write to
    disk while the rest is written: `_atomic.start_writeback`).
    """
    f.write(encode_header(arrays, meta))
    if writeback is not None:
        f.flush()
    offset = done = f.tell() if writeback is not None else 0
    for _, array in data_order(arrays):
        array = np.ascontiguousarray(array)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        # The array's own buffer goes to the file: no bytes object in between.
        data = array.reshape(-1).view(np.uint8).data
        if writeback is None:
            f.write(data)
            continue
        for start in range(0, len(data), WRITEBACK_CHUNK):
            piece = data[start : start + WRITEBACK_CHUNK]
            f.write(piece)
            offset += len(piece)
            if offset - done >= WRITEBACK_CHUNK:
                f.flush()
                writeback(f.fileno(), done, offset - done)
                done = offset


def _bad(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: not a usable safetensors checkpoint: {what}.")


def read_header(path: str | os.PathLike) -> Header:
    """Parse and check the header of the safetensors file at `path`.

    Checks that every tensor's byte range is consistent with its dtype and shape and
    lies inside the file, so that a truncated or corrupted file is reported here,
    not by a crash later. **Raises** `CheckpointError` naming the file.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            identity = file_identity(os.fstat(f.fileno()))
            size = identity[2]
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"the file is {size} bytes long (empty or truncated)")
            (length,) = struct.unpack("<Q", head)
            if length > min(_MAX_HEADER, size - 8):
                raise _bad(path, f"the header length {length} does not fit the file")
            raw = f.read(length)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file.") from None
    except IsADirectoryError:
        raise CheckpointError(
            f"{path}: is a directory, not a checkpoint file."
        ) from None
    try:
        entries = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"the header is not JSON ({e})") from None
    if not isinstance(entries, dict):
        raise _bad(path, "the header is not a JSON object")
    metadata = entries.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise _bad(path, "`__metadata__` is not a map of strings")
    tensors = {name: _tensor(path, name, e) for name, e in entries.items()}
    _check_layout(path, tensors, size - 8 - length)
    return Header(tensors, metadata, 8 + length, identity)


def _tensor(path: str, name: str, entry: Any) -> TensorInfo:
    try:
        dtype = _DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise _bad(path, f"tensor {name!r} has a malformed entry {entry!r}") from None
    if any(d < 0 for d in shape) or end - begin != dtype.itemsize * int(
        np.prod(shape, dtype=np.int64)
    ):
        raise _bad(path, f"tensor {name!r}: byte range does not match its shape")
    return TensorInfo(dtype, shape, begin, end)


def _check_layout(path: str, tensors: dict[str, TensorInfo], data_size: int) -> None:
    spans = sorted((t.begin, t.end, n) for n, t in tensors.items())
    expected = 0
    for begin, end, name in spans:
        if begin != expected:
            raise _bad(path, f"tensor {name!r} overlaps another or leaves a gap")
        expected = end
    if expected > data_size:
        raise _bad(
            path,
            f"the file is truncated: its header needs {expected} bytes of data, "
            f"the file has {data_size}",
        )
    if expected < data_size:
        raise _bad(path, f"{data_size - expected} bytes follow the last tensor")


def tensor_view(data: np.ndarray, data_start: int, info: TensorInfo) -> np.ndarray:
    """One tensor of the file, a view of `data` (the whole file's bytes)."""
    if info.begin == info.end:
        return np.zeros(info.shape, info.dtype)
    begin = data_start + info.begin
    return data[begin : data_start + info.end].view(info.dtype).reshape(info.shape)
