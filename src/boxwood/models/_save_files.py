"""The weight files `save_pretrained` writes: one `model.safetensors`, or shards
no larger than `max_shard_size` with the index `transformers` reads
(`model.safetensors.index.json`); the tensors cast to a `dtype` on the way."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from .._checkpoint import atomic_write, write_file

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20}
_UNITS["GIB"] = 2**30


def shard_bytes(max_shard_size: Any) -> int | None:
    """`max_shard_size` in bytes: an int, or a string as `transformers` takes it
    (`"5GB"`, `"500MB"`, `"2GiB"`); `None` for no limit."""
    if max_shard_size is None:
        return None
    if isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool):
        size = max_shard_size
    else:
        found = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]+)\s*", str(max_shard_size))
        if found is None or found.group(2).upper() not in _UNITS:
            raise ValueError(
                "`save_pretrained`: `max_shard_size` must be a number of bytes or a "
                f"size such as '5GB', '500MB' or '2GiB', got {max_shard_size!r}."
            )
        size = int(found.group(1)) * _UNITS[found.group(2).upper()]
    if size < 1:
        raise ValueError(
            f"`save_pretrained`: `max_shard_size` must be positive, got {size}."
        )
    return size


def cast_arrays(arrays: list[tuple[str, Any]], dtype: Any) -> list[tuple[str, Any]]:
    """The floating arrays of `arrays` in `dtype` (on the host), the others as
    they are; `dtype` `None` keeps every array's."""
    if dtype is None:
        return arrays
    target = np.dtype(dtype)
    if not np.issubdtype(target, np.floating) and target.name != "bfloat16":
        raise TypeError(
            f"`save_pretrained`: `dtype` must be a floating dtype (jnp.float32, "
            f"jnp.bfloat16, ...), got {dtype!r}."
        )

    def cast(array: Any) -> Any:
        array = np.asarray(array)
        floating = np.issubdtype(array.dtype, np.floating) or array.dtype.name == (
            "bfloat16"
        )
        return array.astype(target) if floating else array

    return [(name, cast(array)) for name, array in arrays]


def write_weights(
    directory: str, arrays: list[tuple[str, Any]], max_bytes: int | None
) -> None:
    """`arrays` as `model.safetensors`, or, past `max_bytes`, as shards in file
    order with their index; the other layout's files left from an earlier save
    are removed (a loader would prefer them)."""
    groups = _groups(arrays, max_bytes)
    if len(groups) == 1:
        write_file(os.path.join(directory, SINGLE), arrays, {"format": "pt"})
        _remove(directory, lambda n: n == INDEX or _SHARD.fullmatch(n) is not None)
        return
    weight_map = {}
    names = [
        f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        for i in range(len(groups))
    ]
    for name, group in zip(names, groups):
        write_file(os.path.join(directory, name), group, {"format": "pt"})
        weight_map.update({tensor: name for tensor, _ in group})
    total = sum(int(np.asarray(a).nbytes) for _, a in arrays)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    text = json.dumps(index, indent=2, sort_keys=True).encode()

    def write(f: Any) -> None:
        f.write(text)

    atomic_write(os.path.join(directory, INDEX), write)
    kept = set(names)
    _remove(
        directory,
        lambda n: n == SINGLE or (_SHARD.fullmatch(n) is not None and n not in kept),
    )


def _groups(arrays: list[tuple[str, Any]], max_bytes: int | None) -> list[list]:
    """`arrays` in consecutive groups of at most `max_bytes` (a larger tensor
    alone in its group, as `transformers` shards)."""
    if max_bytes is None:
        return [arrays]
    groups: list[list] = [[]]
    size = 0
    for name, array in arrays:
        nbytes = int(np.asarray(array).nbytes)
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, array))
        size += nbytes
    return groups


def _remove(directory: str, stale: Any) -> None:
    for name in os.listdir(directory):
        if stale(name):
            os.remove(os.path.join(directory, name))
