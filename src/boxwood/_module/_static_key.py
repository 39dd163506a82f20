"""Static values that compare equal but are not the same value.

`1 == 1.0 == True` and `0.0 == -0.0`, yet as static values they give different
programs (`x * 1` is int32, `x * 1.0` float32; `1 / -0.0` is `-inf`). JAX compares
static values with `==`, so on its own it would reuse one compiled program for
both. `strict(value)` is what `==` leaves out: the type of a number and the sign
of a float, recursively through tuples and frozensets. Keys of compiled code
include it next to the value itself.

A module carries the strict form of its static fields (with its class, see
`key`) in its hidden meta field (`_register.REBUILD_NAME`), so its treedef tells
such modules apart too: treedefs of two module classes with the same field values
would otherwise compare equal (seen with jax 0.10.2).
"""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np

# values of these types are equal only to values of the same type (or by identity)
_SELF_TYPED = frozenset(
    {
        str, bytes, type(None), type, types.FunctionType, types.BuiltinFunctionType,
        types.MethodType,
    }
)  # fmt: skip
_INTS = frozenset({int, bool})


def strict(value: Any) -> Any:
    """What tells `value` apart from values that compare equal to it: `None` for
    values equal only to their own type, otherwise the type (and a float's sign)."""
    typ = type(value)
    if typ in _SELF_TYPED:
        return None
    if typ in _INTS:
        return typ
    if typ is float or isinstance(value, (float, np.floating)):
        return (typ, math.copysign(1.0, value))
    if isinstance(value, (complex, np.complexfloating)):
        return (typ, math.copysign(1.0, value.real), math.copysign(1.0, value.imag))
    if typ is tuple or isinstance(value, tuple):
        return (typ, tuple(map(strict, value)))
    if isinstance(value, frozenset):
        return (typ, frozenset((v, strict(v)) for v in value))
    return typ


def needs_strict(types_: tuple) -> bool:
    """Whether static values of these types can be equal to another type's (or
    differ in sign): only then must a key carry their `strict` form."""
    return any(t not in _SELF_TYPED and t not in _INTS for t in types_)


class StaticKey(tuple):
    """A module's hidden meta field: its class, then the strict form of each static
    field. A tuple (compared and hashed as one, in C) with a short repr, as it
    shows in treedefs. Its type also marks JAX's rebuild of a module (`_register`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<static key>"


def key(cls: type, values: dict) -> StaticKey:
    """The hidden meta field of an instance of `cls` whose dict is `values`."""
    names = cls._boxwood_static  # type: ignore[attr-defined]
    if not names:
        return cls._boxwood_rebuild  # type: ignore[attr-defined]
    return StaticKey((cls, *[strict(values[n]) for n in names]))


class ValueKey:
    """A static value as part of a dictionary key (of code compiled or traced for
    it): compared by value and `strict` form where it is hashable, so `True` and
    `1` are apart, and by identity otherwise (holding the value, so that its `id`
    is not reused while the key lives)."""

    __slots__ = ("value", "_strict")

    def __init__(self, value: Any) -> None:
        self.value = value
        try:
            hash(value)
            self._strict: Any = strict(value)
        except TypeError:
            self._strict = _BY_IDENTITY

    def __hash__(self) -> int:
        if self._strict is _BY_IDENTITY:
            return id(self.value)
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueKey) or self._strict != other._strict:
            return False
        if self._strict is _BY_IDENTITY:
            return self.value is other.value
        return bool(self.value == other.value)


_BY_IDENTITY = object()
