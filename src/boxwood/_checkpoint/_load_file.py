"""`boxwood.load` of one safetensors file, and the checks of a file's metadata
against `like` that orbax loads share: typed PRNG keys stored as key data, and
the structure fingerprint named where the tensors do not match."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ._assemble import assemble
from ._error import CheckpointError
from ._format import read_header
from ._leaves import Leaf, fingerprint, stored_leaves
from ._safetensors import FINGERPRINT_KEY, KEYS_KEY, file_tensors


def key_problems(metadata: dict, names: Any, like_leaves: list[Leaf]) -> list[str]:
    """Leaves whose typed-key-ness (or key impl) differs between file and `like`."""
    stored = json.loads(metadata.get(KEYS_KEY, "{}"))
    problems = []
    for leaf in like_leaves:
        if leaf.name not in names:
            continue
        if leaf.key_impl != stored.get(leaf.name):
            has = stored.get(leaf.name)
            has = f"a PRNG key array of impl {has!r}" if has else "a plain array"
            want = (
                f"a PRNG key array of impl {leaf.key_impl!r}"
                if leaf.key_impl
                else "a plain array"
            )
            problems.append(f"{leaf.name}: file has {has}, model expects {want}")
    return problems


def load_file(path: Any, like: Any, *, strict: bool = True, dtype: Any = None) -> Any:
    path = os.fspath(path)
    header = read_header(path)
    like_leaves, _, _ = stored_leaves(like)
    check_keys(path, header.metadata, header.tensors, like_leaves)
    tree, _ = assemble(
        like,
        file_tensors(path, header),
        strict=strict,
        cast=dtype,
        source=f"the checkpoint {path}",
        hint=fingerprint_hint(header.metadata, like_leaves),
    )
    return tree


def check_keys(path: str, metadata: dict, names: Any, like_leaves: list[Leaf]) -> None:
    problems = key_problems(metadata, names, like_leaves)
    if problems:
        raise CheckpointError(
            f"Cannot load the checkpoint {path} into the given tree:\n"
            + "\n".join(f"  - {p}" for p in problems),
            problems,
        )


def fingerprint_hint(metadata: dict, like_leaves: list[Leaf]) -> Callable[[Any], str]:
    """The error's last line when the file's structure differs from `like`'s."""

    def hint(report: Any) -> str:
        have = metadata.get(FINGERPRINT_KEY)
        if have and have != fingerprint(like_leaves):
            return (
                "The file was saved from a tree of a different structure (fingerprint "
                f"{have}, the given tree's is {fingerprint(like_leaves)}): build "
                "`like` with the same model and options as the saved one, or use "
                "`load_state_dict(..., key_map=...)` to rename keys."
            )
        return ""

    return hint
