"""The files of a `save_pretrained` directory: `config.json`, and the tensors of
`model.safetensors` or of the shards its index lists, under the model's names:
the published layout that fits, a tied copy checked and left out, the optional
parts the file lacks, the renaming to the model's names."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np

from .._checkpoint import CheckpointError, Tensor, read_tensors
from ._model_config import ConfigError, read_json

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def config_path(directory: str) -> str:
    """`directory/config.json`, after checking both exist."""
    if not os.path.isdir(directory):
        raise ConfigError(
            f"{directory}: no such directory. `from_pretrained` reads a local "
            "directory as `transformers`' `save_pretrained` writes it (it never "
            "downloads anything)."
        )
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(
            f"{directory}: has no `config.json`, so it is not a `save_pretrained` "
            f"directory (it holds: {', '.join(sorted(os.listdir(directory))) or 'nothing'})."
        )
    return path


def checkpoint_tensors(directory: str) -> dict[str, Tensor]:
    """Every tensor of the checkpoint by its name in the file, read lazily; those
    whose data begin on a 64-byte boundary of their file (all of a file written by
    boxwood) become views of the file's memory map, which the device adopts
    without a copy (`read_tensors(..., zero_copy=True)`)."""
    tensors: dict[str, Tensor] = {}
    for path in _safetensors_files(directory):
        tensors.update(read_tensors(path, zero_copy=True))
    return tensors


def _safetensors_files(directory: str) -> list[str]:
    """`model.safetensors`, or else the shards that the index lists."""
    single = os.path.join(directory, SINGLE)
    if os.path.isfile(single):
        return [single]
    index = os.path.join(directory, INDEX)
    if not os.path.isfile(index):
        raise ConfigError(
            f"{directory}: has neither `{SINGLE}` nor `{INDEX}`; boxwood reads "
            "safetensors checkpoints only (convert a `pytorch_model.bin` with "
            "`model.save_pretrained(path, safe_serialization=True)` in transformers)."
        )
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{index}: has no `weight_map` object.")
    paths = []
    for name in sorted(set(weight_map.values())):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ConfigError(f"{index}: lists the shard `{name}`, which is missing.")
        paths.append(path)
    return paths


def without_tied_copies(
    tensors: dict[str, Any], tied: dict[str, str], directory: str, owner: str
) -> dict[str, Any]:
    """`tensors` less the copies of `tied` (`{name: name of the tensor it must
    equal}`, a class's `tied_tensors`) it holds, after checking each equals its
    original (`CheckpointError` naming both and `owner`, the class, otherwise)."""
    out = dict(tensors)
    for copy_name, original in tied.items():
        if copy_name not in out or original not in out:
            continue
        a, b = out[copy_name], out[original]
        same = tuple(a.shape) == tuple(b.shape) and np.array_equal(a.read(), b.read())
        if not same:
            raise CheckpointError(
                f"the checkpoint in {directory}: `{copy_name}` differs from "
                f"`{original}`, but {owner} ties them (its output "
                "projection is the token embedding), so the file describes "
                f"another model; remove `{copy_name}` from the file, or set "
                "`tie_word_embeddings` to false where the class allows it."
            )
        del out[copy_name]
    return out


def absent_parts(
    tensors: dict[str, Any], names: dict[str, str], optional: tuple[str, ...]
) -> list[str]:
    """The attributes of `optional` of which the file has no tensor (`names`:
    file name -> the model's name, which begins with its attribute's)."""
    return [
        part
        for part in optional
        if not any(
            n in tensors for n, own in names.items() if own.startswith(f"{part}.")
        )
    ]


def renamed_tensors(
    tensors: dict[str, Any],
    names: dict[str, str],
    dropped: str | None,
) -> tuple[dict[str, Any], list[str]]:
    """The file's tensors under the model's names (`names`: file name -> model
    name), and the names left out: those the model lacks are kept (and reported
    as unexpected), except `dropped` (a regular expression) ones (buffers
    `transformers` may store, other heads' parameters)."""
    out, left_out = {}, []
    for file_name, tensor in tensors.items():
        if file_name not in names and dropped and re.fullmatch(dropped, file_name):
            left_out.append(file_name)
            continue
        out[names.get(file_name, file_name)] = tensor
    return out, left_out


def floating_dtype(tensors: dict[str, Any]) -> Any:
    """The dtype of the checkpoint's floating-point tensors (the first one's)."""
    for tensor in tensors.values():
        if np.issubdtype(tensor.dtype, np.floating) or tensor.dtype.name == "bfloat16":
            return tensor.dtype
    return np.dtype(np.float32)


@dataclasses.dataclass(frozen=True)
class FileLayout:
    """One way a published file names a model's tensors: `rewrites` are `(pattern,
    replacement)` pairs of `re.sub`, applied in order, that turn each of the file's
    names into the name `save_pretrained` gives the same tensor (a name no pattern
    matches is kept as it is)."""

    description: str
    rewrites: tuple[tuple[str, str], ...] = ()

    def standard_name(self, name: str) -> str:
        for pattern, replacement in self.rewrites:
            name = re.sub(pattern, replacement, name)
        return name

    def apply(self, tensors: dict[str, Any]) -> dict[str, Any] | None:
        """`tensors` under their `save_pretrained` names; `None` if two of them
        would get one name (the file is not in this layout)."""
        out = {self.standard_name(name): t for name, t in tensors.items()}
        return out if len(out) == len(tensors) else None


SAVE_PRETRAINED = FileLayout("`save_pretrained`")


def standard_tensors(
    tensors: dict[str, Any], expected: set[str], layouts: tuple[FileLayout, ...]
) -> dict[str, Any]:
    """The file's tensors under their `save_pretrained` names, read with the layout
    (`save_pretrained`'s own first, then `layouts`) under which most of the
    `expected` names are found; the first such layout on a tie, so a file that
    fits none is reported against `save_pretrained`'s names."""
    best, best_found = tensors, -1
    for layout in (SAVE_PRETRAINED, *layouts):
        renamed = layout.apply(tensors)
        if renamed is None:
            continue
        found = len(expected.intersection(renamed))
        if found > best_found:
            best, best_found = renamed, found
        if found == len(expected):
            break
    return best
