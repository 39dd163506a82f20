"""Construction-time checks and the error messages that teach the fix."""

from __future__ import annotations

import os
import sys
import sysconfig
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

MSG_MUTABLE_STATIC = (
    "`{cls}.{name}` is a static field holding a {kind}: static fields are part of "
    "the compiled code's cache key, and a {kind} can be changed in place after "
    "construction, where no cache can see it (a compiled call would keep using "
    "the old contents). Use {fix}."
)
_MUTABLE = {
    list: "a tuple",
    dict: "a tuple of `(key, value)` pairs (or a module holding the values)",
    set: "a frozenset",
}

_LIBRARY_ROOTS = tuple(
    {
        os.path.normcase(sysconfig.get_paths()[kind]) + os.sep
        for kind in ("purelib", "platlib", "stdlib", "platstdlib")
    }
)


def _library_class(cls: type) -> bool:
    """A class of an installed library (whose fields its users cannot change)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return path is not None and os.path.normcase(path).startswith(_LIBRARY_ROOTS)


# (class, field) pairs already warned about: each warns once
_WARNED: set[tuple] = set()  # (class, field), and (class, field, list)


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
    (a jit cache lookup) fails. A list, dict or set warns too (once per class
    and field, for classes outside installed libraries), since it can be changed
    in place where no cache can see it; it is accepted, as in Equinox. Other unhashable values (a treedef inside a tuple)
    are accepted without a word: structures are compared with `==`, and
    `filter_jit` says which field when it does need a hash.
    """
    if type(value) in _MUTABLE:
        if (cls, name, list) in _WARNED or _library_class(cls):
            return
        _WARNED.add((cls, name, list))
        warnings.warn(
            MSG_MUTABLE_STATIC.format(
                cls=cls.__name__,
                name=name,
                kind=type(value).__name__,
                fix=_MUTABLE[type(value)],
            ),  # fmt: skip
            UserWarning,
            stacklevel=5,
        )
        return
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


_TRANSFORM_TYPES: set[type] = set()


def _transform_types() -> set[type]:
    """The classes of what `jax.jit(f)`, `jax.grad(f)`, ... return (built on first
    use: importing boxwood must not trace anything)."""
    if not _TRANSFORM_TYPES:
        for transform in (
            jax.jit, jax.grad, jax.vmap, jax.value_and_grad, jax.jacfwd, jax.jacrev,
            jax.hessian, jax.custom_jvp, jax.custom_vjp, jax.checkpoint, jax.pmap,
        ):  # fmt: skip
            _TRANSFORM_TYPES.add(type(transform(lambda x: x)))
    return _TRANSFORM_TYPES


def check_transformed(cls: type, name: str, value: Any) -> None:
    """Warn when a field holds a JAX-transformed callable wrapping arrays (for
    example `jax.vmap(linear)`): its arrays are hidden from the pytree, so they
    are neither trained nor seen by transformations. As Equinox warns."""
    if type(value) not in _transform_types():
        return
    while True:
        value = getattr(value, "__wrapped__", _transform_types)
        if value is _transform_types:
            return
        if _has_arrays(value):
            warnings.warn(
                f"Possibly assigning a JAX-transformed callable as an attribute on "
                f"{cls.__module__}.{cls.__qualname__} (field `{name}`). This will "
                "not have any of its parameters updated: its arrays are inside the "
                "transformed function, hidden from the pytree. Store the module "
                "itself and apply the transformation when calling it (for example "
                "`jax.vmap(self.linear)(x)` in `__call__`), or use "
                "`boxwood.filter_vmap(module)`, which is a module.",
                UserWarning,
                stacklevel=5,
            )
            return
