"""The parameters a load draws anew: a class's task head that the file lacks
(`Pretrained.NEW_ON_LOAD`), or holds with other shapes than the config gives it
(`ignore_mismatched_sizes=True`), drawn as a fresh build draws them, and the
warning that lists them with the other heads' tensors the load dropped."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from .._caches import register_cache_clear
from .._checkpoint import ArrayTensor
from .._paths import dotted_path
from ._stacking import Slot

# The compiled draws (`drawn`), by class, config, dtype and names, most recently
# made last.
_PROGRAMS: OrderedDict[Any, Any] = OrderedDict()
_KEPT = 16
_LOCK = threading.Lock()


def matching(pattern: str | None, names: list[str]) -> list[str]:
    """The names of `names` that `pattern` matches whole, sorted."""
    if pattern is None:
        return []
    return sorted(n for n in names if re.fullmatch(pattern, n))


def drawn(
    cls: type,
    config: Any,
    dtype: Any,
    key: Any,
    slots: dict[str, Slot],
    names: list[str],
    which: Any,
) -> dict[str, ArrayTensor]:
    """The parameters `names` (boxwood's names) as `cls(config, dtype, key=key)`
    draws them (`key` default `jax.random.key(0)`). The build is compiled (once
    per class, config, dtype and names), so that only these parameters are
    computed: XLA drops the rest (BERT-base's build: about 1 s compiled, 6 s run
    eagerly on two CPU cores). `which` identifies the class, config and dtype
    (`slots` are the layer view of their abstract build, `layer_slots`)."""
    which = (which, tuple(names))
    with _LOCK:
        program = _PROGRAMS.get(which)
    if program is None:

        def build(key: Any) -> list[Any]:
            model = cls(config, dtype, key=key)
            flat = jtu.tree_flatten_with_path(model)[0]
            leaves = {dotted_path(path): leaf for path, leaf in flat}
            return [leaves[slots[n].source][slots[n].index] for n in names]

        program = jax.jit(build)
        with _LOCK:
            _PROGRAMS[which] = program
            while len(_PROGRAMS) > _KEPT:
                _PROGRAMS.popitem(last=False)
    arrays = program(jax.random.key(0) if key is None else key)
    return {n: ArrayTensor(np.asarray(a)) for n, a in zip(names, arrays)}


def resized_head(
    cls: Any, slots: dict[str, Slot], tensors: dict[str, Any], names: dict[str, str]
) -> dict[str, tuple[tuple, tuple]]:
    """`{name: (shape in the file, shape in the model)}` for each tensor of the
    class's head (`NEW_ON_LOAD`) that the file holds with another shape (another
    number of labels than the config's), by checkpoint name. `names` maps
    checkpoint names to boxwood's, by which `tensors` and `slots` (the model's
    layer view, `layer_slots`) are keyed."""
    out = {}
    held = [n for n, own in names.items() if own in tensors]
    for name in matching(cls.NEW_ON_LOAD, held):
        have, want = tuple(tensors[names[name]].shape), slots[names[name]].shape
        if have != want:
            out[name] = (have, want)
    return out


def _shapes(resized: dict[str, tuple[tuple, tuple]]) -> str:
    return "; ".join(
        f"`{n}` is {have} in the file, {want} in the model"
        for n, (have, want) in resized.items()
    )


def resized_message(
    cls: type, directory: str, resized: dict[str, tuple[tuple, tuple]]
) -> str:
    """The error of a load whose file holds the head with other shapes."""
    name = cls.__name__
    return (
        f"{name}.from_pretrained: the checkpoint in {directory} holds {name}'s "
        f"head with other shapes than the config gives it: {_shapes(resized)}. "
        "The config (an override such as `num_labels=`, or the file's "
        "`config.json`) does not describe these weights. To fine-tune on another "
        "task, pass `ignore_mismatched_sizes=True`, which draws these parameters "
        "anew; to use the file's head, load without the override."
    )


def new_parameters_message(
    cls: type,
    directory: str,
    new: list[str],
    unused: list[str],
    resized: dict[str, tuple[tuple, tuple]] | None = None,
) -> str:
    """The warning of a load that drew `new` parameters (those of `resized` among
    them, which the file holds with other shapes) and dropped the other heads'
    tensors `unused`, all by their checkpoint names."""
    name = cls.__name__
    listed = lambda names: ", ".join(f"`{n}`" for n in names)
    if not new:
        return dropped_message(cls, directory, unused)
    resized = resized or {}
    absent = [n for n in new if n not in resized]
    has = f"has no {listed(absent)}" if absent else ""
    if resized:
        has += " and " if absent else ""
        has += f"holds other shapes of {listed(resized)} ({_shapes(resized)})"
    text = (
        f"{name}.from_pretrained: the checkpoint in {directory} {has}; these "
        f"parameters of {name}'s head are newly initialised "
        f"(as `{name}(config, key=key)` draws them; `key` is `from_pretrained`'s "
        "`key=`, default `jax.random.key(0)`). Train the model (fine-tune it on "
        "its task) before using it for predictions."
    )
    if unused:
        text += (
            f" The checkpoint's {listed(unused)} are not used by {name} (another "
            "head's parameters) and were dropped."
        )
    return text


def dropped_message(cls: type, directory: str, unused: list[str]) -> str:
    """The warning of a load that drew nothing but dropped the other heads'
    tensors `unused` (a sequence classifier's pooler, read by a token
    classifier)."""
    name = cls.__name__
    listed = ", ".join(f"`{n}`" for n in unused)
    return (
        f"{name}.from_pretrained: the checkpoint in {directory} holds {listed}, "
        f"which {name} does not use (another head's parameters): they were "
        "dropped. Load the file with the class it was saved from "
        "(`boxwood.models.from_pretrained` chooses it) to keep them."
    )


@register_cache_clear
def _clear_programs() -> None:
    with _LOCK:
        _PROGRAMS.clear()
