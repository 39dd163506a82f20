"""Construction-time checks and the error messages that teach the fix."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import numpy as np

MSG_FROZEN = (
    "Cannot assign `{cls}.{name}` after `__init__` has finished: modules are immutable "
    "pytrees. Make a modified copy instead:\n"
    "    model = boxwood.tree_at(lambda m: m.{name}, model, new_value)"
)

MSG_METHOD = (
    "Cannot assign methods in __init__: `self.{name} = self.<method>` in "
    "`{cls}.__init__` stores a bound method of the module being built, which would "
    "hold a copy of the half-initialised module. Call the method where it is "
    "needed instead, or store the plain function (`type(self).<method>`)."
)

MSG_POST_INIT = (
    "Class `{cls.__module__}.{cls.__qualname__}` has both an `__init__` method and "
    "a `__post_init__` method, so `__post_init__` will not run: dataclasses call it "
    "from the `__init__` they generate, which a custom `__init__` replaces. Call it "
    "from your `__init__`, or move the checks into `__check_init__`, which always "
    "runs."
)

MSG_UNSET = (
    "Field {first!r} was not initialized: `{cls}.__init__` did not assign the "
    "field{s} {names}. Every field must be set in `__init__` (or given a default in "
    "the class body)."
)

MSG_ABSTRACT = (
    "Can't instantiate abstract class `{cls}` with {what}: define "
    "{them} in `{cls}` or one of its bases (as a field, a class attribute, or a "
    "property)."
)

# (class, field) pairs already warned about: each warns once
_WARNED: set[tuple[type, str]] = set()


def _has_arrays(value: Any) -> bool:
    if isinstance(value, (jax.Array, np.ndarray)):
        return True
    try:
        leaves = jax.tree_util.tree_leaves(value)
    except Exception:  # a custom node whose flatten fails: nothing to report
        return False
    return any(isinstance(x, (jax.Array, np.ndarray)) for x in leaves)


def check_static_value(cls: type, name: str, value: Any) -> None:
    """Warn (once per class and field) when a static field holds arrays.

    Equinox accepts this with a warning, so boxwood does too: the module can be
    built, flattened and mapped over; only what compares or hashes its structure
    (a jit cache lookup) fails. Unhashable values (a list, a treedef inside a
    tuple) are accepted without a word: structures are compared with `==`, and
    `filter_jit` says which field when it does need a hash.
    """
    if (cls, name) in _WARNED or not _has_arrays(value):
        return
    _WARNED.add((cls, name))
    warnings.warn(
        f"A JAX array is being set as static! `{cls.__name__}.{name}` is a static "
        "field but holds an array (or a pytree containing arrays). Static fields are part of the pytree structure: they "
        "are not traced, and a jit call cannot compare or hash arrays there. Declare "
        "the field with `field(static=False)` (the default) so that its arrays are "
        "traced leaves.",
        UserWarning,
        stacklevel=5,
    )


def plural(names: list[str]) -> dict[str, str]:
    quoted = ", ".join(f"`{n}`" for n in names)
    many = len(names) > 1
    return {"names": quoted, "s": "s" if many else "", "them": "them" if many else "it"}
