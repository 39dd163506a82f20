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

from ._static_key import StaticKey

REBUILD_NAME = "_boxwood_rebuild"
# The second hidden meta field: the class and the strict form of the static fields
# (`_static_key.py`), so that treedefs tell apart what `==` on the values does not.
KEY_NAME = "_boxwood_key"


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
    # the key of an instance without one of its own (e.g. unpickled from an older
    # version): the class alone
    setattr(cls, KEY_NAME, StaticKey((cls,)))
    real = cls.__dict__["__dataclass_fields__"]
    # Non-init fields are state too: show them as init fields so that they can be
    # registered (the rebuild path never calls `__init__`).
    shown = {}
    for name, f in real.items():
        if f._field_type is dataclasses._FIELD and not f.init:  # type: ignore[attr-defined]
            f = copy.copy(f)
            f.init = True
        shown[name] = f
    for hidden in (REBUILD_NAME, KEY_NAME):
        sentinel_field: Any = dataclasses.field(default=None)
        sentinel_field.name = hidden
        sentinel_field._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
        shown[hidden] = sentinel_field
    type.__setattr__(cls, "__dataclass_fields__", shown)
    try:
        jax.tree_util.register_dataclass(
            cls,
            data_fields=data_fields,
            meta_fields=[*meta_fields, REBUILD_NAME, KEY_NAME],
        )
    finally:
        type.__setattr__(cls, "__dataclass_fields__", real)
