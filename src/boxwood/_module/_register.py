"""Pytree registration of Module subclasses on JAX's C++ dataclass path.

`jax.tree_util.register_dataclass` flattens in C++ (as fast as JAX gets), but its
unflatten calls `cls(**fields)`, which would run a user's custom `__init__` and its
converters on every rebuild. We register one extra *meta* field, `_boxwood_rebuild`,
whose value is the instance's static key (`_static_key.StaticKey`: its class and the
strict form of its static fields, so that treedefs also tell apart what `==` on the
static values does not). C++ unflatten therefore calls
`cls(_boxwood_rebuild=<a StaticKey>, **fields)`, and the metaclass's `__call__` (see
`_construct.py`) recognises the key
by its type and fills the instance's `__dict__` directly, never calling `__init__`.
Every instance holds its key in its own `__dict__` (an instance-dict hit is the
cheapest attribute read for the C++ flatten: measured 1.1x a plain dataclass, against 1.4x for a class
attribute); a class attribute (the class alone) remains as a fallback.

`register_dataclass` checks that the registered names equal the dataclass's
`init=True` fields; the key is not a field, so during registration we show it a
field table that includes it. Nothing else sees that table.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax

from ._static_key import StaticKey

REBUILD_NAME = "_boxwood_rebuild"

# Every registered Module class (registered with JAX, so never freed anyway):
# `type(x) in MODULE_TYPES` is a much cheaper test than `isinstance(x, Module)` (an
# ABC check). Read by display and by `filter_jit`'s argument walk.
MODULE_TYPES: set[type] = set()


class _RebuildSentinel:
    """The marker of earlier versions (kept so that their pickles load: such a
    module is rebuilt through its class, as any construction)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<boxwood rebuild>"

    def __reduce__(self) -> str:
        return "REBUILD"  # pickle/deepcopy keep the one sentinel object


REBUILD = _RebuildSentinel()


def register(cls: type, data_fields: list[str], meta_fields: list[str]) -> None:
    """Register `cls` (already a dataclass) with JAX's C++ dataclass flattening."""
    # the key of an instance without one of its own: the class alone
    setattr(cls, REBUILD_NAME, StaticKey((cls,)))
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
    key_field: Any = dataclasses.field(default=None)
    key_field.name = REBUILD_NAME
    key_field._field_type = dataclasses._FIELD  # pyright: ignore[reportAttributeAccessIssue]
    shown[REBUILD_NAME] = key_field
    type.__setattr__(cls, "__dataclass_fields__", shown)
    try:
        jax.tree_util.register_dataclass(
            cls,
            data_fields=data_fields,
            meta_fields=[*meta_fields, REBUILD_NAME],
        )
    finally:
        type.__setattr__(cls, "__dataclass_fields__", real)
    MODULE_TYPES.add(cls)
