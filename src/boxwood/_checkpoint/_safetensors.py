"""`save`, `load` and `read_metadata`: one tree, one safetensors file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._atomic import atomic_write, start_writeback
from ._error import CheckpointError
from ._format import (
    ALIGNMENT,
    Header,
    TensorInfo,
    dtype_name,
    file_identity,
    read_header,
    write_arrays,
)
from ._host_memory import aligned_empty, load_region
from ._leaves import Leaf, fingerprint, stored_leaves
from ._mapping import FileMapping, changed_while_loading, copy_requested

# Keys of the file's `__metadata__` (safetensors metadata is a map of strings).
VERSION_KEY = "boxwood.version"
FINGERPRINT_KEY = "boxwood.fingerprint"
USER_KEY = "boxwood.metadata"
KEYS_KEY = "boxwood.prng_keys"


def _version() -> str:
    from .._version import __version__

    return __version__


def encode_metadata(leaves: list[Leaf], metadata: dict | None) -> dict[str, str]:
    """The file's string metadata: version, fingerprint, user metadata, key impls."""
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(
            f"`metadata` must be a dict (of JSON-serialisable values), got "
            f"{type(metadata).__name__}."
        )
    try:
        user = json.dumps(metadata or {}, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"`metadata` must be JSON-serialisable (numbers, strings, lists, dicts): "
            f"{e}. Convert arrays with `.tolist()` or `float(...)` first."
        ) from None
    out = {
        VERSION_KEY: _version(),
        FINGERPRINT_KEY: fingerprint(leaves),
        USER_KEY: user,
    }
    keys = {leaf.name: leaf.key_impl for leaf in leaves if leaf.key_impl}
    if keys:
        out[KEYS_KEY] = json.dumps(keys)
    return out


def to_host(leaves: list[Leaf], copy: bool) -> list[tuple[str, np.ndarray]]:
    """Every stored leaf as a NumPy array (typed keys as their key data).

    With `copy=True` nothing the caller can still change is shared, so that the
    tree may be changed, donated or deleted right after this returns (background
    saves need this): NumPy leaves are copied. A `jax.Array` needs no copy: on an
    accelerator `np.asarray` is a host copy of its own, and on the CPU it is a view
    of the device buffer that JAX keeps alive and never reuses while the view
    exists (a later donation of that buffer is skipped; `delete()` keeps the memory
    until the view is gone). All transfers are started before the first is awaited.
    """
    values = [
        jax.random.key_data(leaf.value) if leaf.key_impl else leaf.value
        for leaf in leaves
    ]
    for v in values:
        if isinstance(v, jax.Array):
            v.copy_to_host_async()  # all transfers in flight before the first wait
    return [
        (
            leaf.name,
            np.array(v, copy=True)
            if copy and not isinstance(v, jax.Array)
            else np.asarray(v),
        )
        for leaf, v in zip(leaves, values)
    ]


def check_savable(tree: Any) -> list[Leaf]:
    leaves, _, _ = stored_leaves(tree)
    for leaf in leaves:
        try:
            dtype_name(leaf.dtype)
        except CheckpointError as e:
            raise CheckpointError(f"Cannot save `{leaf.name}`: {e}") from None
        if isinstance(leaf.value, jax.ShapeDtypeStruct):
            raise CheckpointError(
                f"Cannot save `{leaf.name}`: it is an abstract "
                "`jax.ShapeDtypeStruct`, not an array. Save a real tree (not the "
                "output of `filter_eval_shape`)."
            )
        if isinstance(leaf.value, jax.Array) and not leaf.value.is_fully_addressable:
            raise CheckpointError(
                f"Cannot save `{leaf.name}` to one file: it spans several processes. "
                'Use `format="orbax"` (install `boxwood[orbax]`).'
            )
    return leaves


def write_file(path: Any, arrays: list[tuple[str, np.ndarray]], meta: dict) -> None:
    """Write `arrays` (`(name, array)` pairs, in file order) and the string map
    `meta` as the safetensors file `path`, crash-safely."""
    atomic_write(path, lambda f: write_arrays(f, arrays, meta, start_writeback))


@dataclass
class FileTensor:
    """One tensor of a file, read on demand: whole, or a slice (one device's
    shard) through the file's mapping.

    With `zero_copy`, a whole read of a tensor whose data begin on a 64-byte
    boundary of the file returns a read-only view of the file's mapping instead
    of a copy (see `_mapping` for how the mapping is kept safe), which the device
    adopts without copying; any other tensor is read into a new aligned array.
    """

    path: str
    info: TensorInfo
    data_start: int
    mapping: FileMapping  # shared by the file's tensors, mapped on first use
    zero_copy: bool = False

    @property
    def dtype(self) -> np.dtype:
        return self.info.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    # What `read()` returns is never written by anyone else: a new array only the
    # caller references, or a read-only view of a private mapping. The device may
    # adopt it (`jax.device_put(..., may_alias=True)`).
    reads_are_owned = True

    @property
    def mapped(self) -> bool:
        """Whether a whole read is a view of the file's mapping (no copy)."""
        return self.zero_copy and self.mapping.can_alias(self.data_start, self.info)

    def fresh_nbytes(self, cast: Any) -> int | None:
        """The bytes of new memory a whole read takes (`read_region`); `None`
        for a floating tensor that is not of dtype `cast`."""
        if cast is not None and jnp.issubdtype(self.dtype, jnp.floating):
            if self.dtype != cast:
                return None
        return 0 if self.mapped else self.info.end - self.info.begin

    def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray:
        if index is not None:
            return np.array(self.mapping.view(self.data_start, self.info)[index])
        if self.zero_copy:
            view = self.mapping.aligned_view(self.data_start, self.info)
            if view is not None:
                return view
        out = aligned_empty(self.info.shape, self.info.dtype)
        self.read_into(out)
        return out

    def read_into(self, out: np.ndarray) -> None:
        """Read the whole tensor into `out`, a C-contiguous array of its dtype and
        number of elements (one layer's row of a stacked buffer: one copy, from
        the file straight to its place)."""
        with open(self.path, "rb") as f:
            identity = self.mapping.identity
            if identity and file_identity(os.fstat(f.fileno())) != identity:
                raise changed_while_loading(self.path)
            f.seek(self.data_start + self.info.begin)
            got = f.readinto(out.reshape(-1).view(np.uint8).data)
        if got != self.info.end - self.info.begin or got != out.nbytes:
            raise changed_while_loading(self.path)


def read_tensors(
    path: str | os.PathLike, *, zero_copy: bool = False
) -> dict[str, FileTensor]:
    """Every tensor of the safetensors file at `path` by name, read on demand; the
    header is read and checked now. With `zero_copy`, aligned tensors are read as
    views of the file's mapping (`FileTensor`), unless the environment variable
    `BOXWOOD_COPY_CHECKPOINTS=1` asks for copies."""
    path = os.fspath(path)
    zero_copy = zero_copy and not copy_requested()
    return file_tensors(path, read_header(path), zero_copy=zero_copy)


def read_region(tensors: Iterable[Any], cast: Any) -> AbstractContextManager[None]:
    """A `load_region` (one mapping, its pages faulted in by a helper thread) for
    the whole reads of `tensors` that copy: room for the buffer of each one's
    `fresh_nbytes(cast)` (a `FileTensor`'s, or a `PartsTensor`'s; other tensors
    are in memory already), each starting on an `ALIGNMENT`-byte boundary. None
    where a tensor says `None` (its read would leave an intermediate buffer in
    the region for as long as the model lives: a cast)."""
    nbytes = 0
    for tensor in tensors:
        fresh = getattr(tensor, "fresh_nbytes", None)
        size = fresh(cast) if fresh is not None else 0
        if size is None:
            return load_region(0)
        nbytes += -(-size // ALIGNMENT) * ALIGNMENT
    return load_region(nbytes)


def file_tensors(
    path: str, header: Header, *, zero_copy: bool = False
) -> dict[str, FileTensor]:
    mapping = FileMapping(path, header.identity)
    return {
        name: FileTensor(path, info, header.data_start, mapping, zero_copy)
        for name, info in header.tensors.items()
    }


def stacked_view(
    parts: Sequence[Any], shape: tuple[int, ...], dtype: Any
) -> np.ndarray | None:
    """The layers `parts` as one array of `shape` and `dtype` (layer `i` at index
    `i` of the leading axes) without a copy: a read-only view of their file's
    mapping, when they are zero-copy `FileTensor`s of one file, of that dtype, laid
    out back to back in that order from a 64-byte boundary (as boxwood's writer
    lays out each parameter's layers: `_format.data_order`). `None` otherwise:
    the caller then copies each layer into place."""
    first = parts[0] if parts else None
    if not isinstance(first, FileTensor) or not first.zero_copy:
        return None
    for part, following in zip(parts, [*parts[1:], None]):
        if not isinstance(part, FileTensor) or part.mapping is not first.mapping:
            return None
        if part.dtype != np.dtype(dtype):
            return None
        if following is not None and part.info.end != following.info.begin:
            return None
    end = parts[-1].info.end
    if end - first.info.begin != np.dtype(dtype).itemsize * np.prod(shape):
        return None
    span = TensorInfo(np.dtype(dtype), tuple(shape), first.info.begin, end)
    return first.mapping.aligned_view(first.data_start, span)


def decode_user_metadata(path: str, header: Header) -> dict:
    raw = header.metadata.get(USER_KEY)
    if raw is None:
        return {
            k: v for k, v in header.metadata.items() if not k.startswith("boxwood.")
        }
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise CheckpointError(
            f"{path}: its metadata is corrupted (not JSON)."
        ) from None
