"""Pytree registration of Module subclasses on JAX's C++ dataclass path.

`jax.tree_util.register_dataclass` flattens in C++ (as fast as JAX gets), but its
unflatten calls `cls(**fields)`, which would run a user's custom `__init__` and its
converters on every rebuild. We register one extra *meta* field, `_boxwood_rebuild`,
whose value is a class attribute holding a private sentinel. C++ unflatten therefore
calls `cls(_boxwood_rebuild=SENTINEL, **fields)`, and the class's `__init__` (or,
with the C extension, its C `tp_init` slot; see `_module._wrap_init`) recognises the
sentinel and fills the instance's `__dict__` directly. Every instance
also holds the sentinel in its own `__dict__` (an instance-dict hit is the cheapest
attribute read for the C++ flatten: measured 1.1x a plain dataclass, against 1.4x
for a class attribute); the class attribute remains as a fallback.

`register_dataclass` checks that the registered names equal the dataclass's
`init=True` fields; the sentinel is not a field, so during registration we show it a
field table that includes the sentinel. Nothing else sees that table.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax

REBUILD_NAME = "_boxwood_rebuild"


class _RebuildSentinel:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<boxwood rebuild>"

    def __reduce__(self) -> str:
        return "REBUILD"  # pickle/deepcopy keep the one sentinel object


REBUILD = _RebuildSentinel()


def register(cls: type, data_fields: list[str], meta_fields: list[str]) -> None:
    """Register `cls` (already a dataclass) with JAX's C++ dataclass flattening."""
    setattr(cls, REBUILD_NAME, REBUILD)
    real = cls.__dict__["__dataclass_fields__"]
    # Non-init fields are state too: show them as init fields so that they can be
    # registered (the rebuild path never calls `__init__`).
    shown = {}
    for name, f in real.items():
        # `dataclasses._FIELD` (a private marker) is absent from the stubs
        if f._field_type is dataclasses._FIELD and not f.init:  # pyright: ignore[reportAttributeAccessIssue]
            f = copy.copy(f)
            f.init = True
        shown[name] = f
    sentinel_field: Any = dataclasses.field(default=None)
    sentinel_field.name = REBUILD_NAME
    sentinel_field._field_type = dataclasses._FIELD  # pyright: ignore[reportAttributeAccessIssue]
    shown[REBUILD_NAME] = sentinel_field
    type.__setattr__(cls, "__dataclass_fields__", shown)
    try:
        jax.tree_util.register_dataclass(
            cls,
            data_fields=data_fields,
            meta_fields=[*meta_fields, REBUILD_NAME],
        )
    finally:
        type.__setattr__(cls, "__dataclass_fields__", real)
