"""What the HTML tree and the summary share: the parts of a module or container,
an array's summary, sizes in bytes, and short reprs.

A *module* here is a dataclass instance that JAX flattens as a node: a boxwood
`Module` (also an Equinox one, or a `jax.tree_util.register_dataclass` class). Its
static fields are those whose `dataclasses.field` metadata says `static` (what
`boxwood.field(static=True)` and Equinox's `field(static=True)` set). So the
display reads modules through the dataclass protocol and needs nothing from
`_module/`, which imports it (`Module._repr_html_`).

A module class may say which of its fields the displays show, with a method
`__boxwood_shown_fields__(self)` returning their names (`nn.StateIndex` shows its
initial value, if any, and not its internal marker).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._pretty import array_summary, function_name

FOLD_AT = 16  # sequences longer than this show their first FOLD_HEAD items ...
FOLD_HEAD = 8  # ... and fold the rest under one collapsed line
REPR_LIMIT = 80  # characters of a static value's repr


def is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class LeafMemo(dict):
    """Per-walk memo of `(summary text, parameters, bytes)` by array type, dtype
    and shape (a large model has thousands of leaves but few distinct kinds of
    array), whether each class is a module, and what the HTML tree's first lines
    report: bytes per dtype and the static fields of each class."""

    def __init__(self) -> None:
        super().__init__()
        self.modules: dict[type, bool] = {}
        self.dtype_bytes: dict[str, int] = {}
        self.static: dict[str, list[str]] = {}


def array_info(x: Any, memo: LeafMemo) -> tuple[str, int, int]:
    """`(f32[4,3], parameters, bytes)` of one array."""
    key = (type(x), x.dtype, x.shape)
    found = memo.get(key)
    if found is None:
        size = int(np.prod(x.shape, dtype=np.int64))
        inexact = jnp.issubdtype(x.dtype, jnp.inexact)  # bfloat16 too
        found = (array_summary(x), size if inexact else 0, size * x.dtype.itemsize)
        memo[key] = found
    return found


def human_bytes(n: float) -> str:
    """`1536` -> `'1.5 KiB'`.

    >>> human_bytes(512), human_bytes(1536), human_bytes(3 * 2**20)
    ('512 B', '1.5 KiB', '3.0 MiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# `<Foo object at 0x7f...>`: the address differs between runs and says nothing
_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


def short_repr(x: Any, limit: int = REPR_LIMIT) -> str:
    text = _ADDRESS.sub("", function_name(x) or repr(x))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_node(x: Any) -> bool:
    """Whether JAX flattens `x` as a node. One level of flattening (every child a
    leaf): a leaf itself is the treedef `*`; a node has a node above its leaves (a
    module whose fields are all static has no leaves at all)."""
    one_level = jax.tree_util.tree_structure(x, is_leaf=lambda y: y is not x)
    return one_level.num_nodes > one_level.num_leaves


def is_module(x: Any, memo: LeafMemo) -> bool:
    """Whether `x` shows as a module (see the module docstring), not as a leaf: a
    dataclass that JAX does not flatten (a model's config) is a value."""
    cls = type(x)
    found = memo.modules.get(cls)
    if found is None:
        found = dataclasses.is_dataclass(cls) and _is_node(x)
        memo.modules[cls] = found
    return found


def module_fields(x: Any) -> list[tuple[str, Any, bool]]:
    """`(name, value, is_static)` for the fields of the module `x` that the
    displays show."""
    fields = [
        (f.name, getattr(x, f.name), bool(f.metadata.get("static", False)))
        for f in dataclasses.fields(x)
    ]
    shown = getattr(type(x), "__boxwood_shown_fields__", None)
    if shown is not None:
        names = set(shown(x))
        fields = [f for f in fields if f[0] in names]
    return fields


def children(x: Any, memo: LeafMemo) -> list[tuple[str, Any, bool]] | None:
    """`(name, value, is_static)` for the parts of a container or module, or `None`
    for a leaf. Names are the parts of the dotted paths of `_paths.py`: field
    names, sequence indices and `str(dict key)`."""
    if is_module(x, memo):
        return module_fields(x)
    fields = getattr(x, "_fields", None)
    if isinstance(x, tuple) and fields is not None:  # NamedTuple
        return [(k, v, False) for k, v in zip(fields, x)]
    if isinstance(x, (list, tuple)):
        return [(str(i), v, False) for i, v in enumerate(x)]
    if isinstance(x, dict):
        return [(str(k), v, False) for k, v in x.items()]
    return None


def type_label(x: Any) -> str:
    if isinstance(x, (list, tuple, dict)) and not hasattr(x, "_fields"):
        return f"{type(x).__name__}[{len(x)}]"
    return type(x).__name__


def kinds(values: list[Any]) -> str:
    """`992 × Linear`, `3 × Linear, 1 × Dropout`: the classes of folded entries."""
    counts: dict[str, int] = {}
    for value in values:
        kind = type_label(value)
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} × {k}" for k, n in counts.items())
