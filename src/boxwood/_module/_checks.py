"""Construction-time checks and the error messages that teach the fix."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

MSG_FROZEN = (
    "Cannot assign `{cls}.{name}` after `__init__` has finished: modules are immutable "
    "pytrees. Make a modified copy instead:\n"
    "    model = boxwood.tree_at(lambda m: m.{name}, model, new_value)"
)

MSG_UNSET = (
    "`{cls}.__init__` did not assign the field{s} {names}. Every field must be set "
    "in `__init__` (or given a default in the class body)."
)

MSG_ABSTRACT = (
    "Cannot instantiate `{cls}`: it does not define the abstract attribute{s} {names}. "
    "Define {them} in the class body of `{cls}` (as a field, a class attribute, or a "
    "property)."
)

_UNHASHABLE_FIX = {
    list: "use a tuple instead of a list",
    dict: "use a tuple of (key, value) pairs instead of a dict",
    set: "use a frozenset instead of a set",
    bytearray: "use bytes instead of a bytearray",
}


def _type_name(value: Any) -> str:
    cls = type(value)
    module = cls.__module__
    if module in ("builtins", None):
        return cls.__name__
    return f"{module.split('.')[0]}.{cls.__name__}"


def check_static_value(cls_name: str, name: str, value: Any) -> None:
    """Raise `TypeError` if `value` cannot live in a pytree's structure."""
    where = f"`{cls_name}.{name}`"
    if isinstance(value, (jax.Array, np.ndarray)):
        raise TypeError(
            f"{where} is a static field but holds an array of type {_type_name(value)}. "
            "Static fields are part of the pytree structure: they are hashed and "
            "compared by value on every jit call, and arrays can be neither. "
            f"Declare the field with `field(static=False)` (the default) so that the "
            "array is a traced leaf, or store a tuple of Python numbers instead."
        )
    arrays = [
        x
        for x in jax.tree_util.tree_leaves(value)
        if isinstance(x, (jax.Array, np.ndarray))
    ]
    if arrays and arrays[0] is not value:
        raise TypeError(
            f"{where} is a static field but holds a pytree containing arrays (a "
            f"{_type_name(value)} with {len(arrays)} array leaves). Static fields are "
            "part of the pytree structure and must not hold arrays. Declare the field "
            "with `field(static=False)` (the default) so that its arrays are traced."
        )
    try:
        hash(value)
    except TypeError as e:
        fix = _UNHASHABLE_FIX.get(type(value))
        hint = fix or (
            "make it hashable (a tuple, a frozen dataclass), or declare the field with "
            "`field(static=False)`"
        )
        raise TypeError(
            f"{where} is a static field but its value of type {_type_name(value)} is "
            f"not hashable ({e}). Static fields are part of the pytree structure and "
            f"must be hashable: {hint}."
        ) from None


def plural(names: list[str]) -> dict[str, str]:
    quoted = ", ".join(f"`{n}`" for n in names)
    many = len(names) > 1
    return {"names": quoted, "s": "s" if many else "", "them": "them" if many else "it"}
