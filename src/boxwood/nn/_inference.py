"""`inference_mode`: switch every `inference` flag in a model."""

from typing import Any, TypeVar

import jax

from .._module import Module, set_fields

_T = TypeVar("_T")


def _has_inference_field(node: Any) -> bool:
    return isinstance(node, Module) and "inference" in type(node)._boxwood_field_names


def _rebuild(node: Any, value: bool) -> Any:
    """Copy of `node` with every Module's `inference` field set to `value`."""
    children, treedef = jax.tree_util.tree_flatten(
        node, is_leaf=lambda c: c is not node
    )
    if len(children) == 1 and children[0] is node:  # a leaf
        return node
    new = treedef.unflatten([_rebuild(child, value) for child in children])
    if _has_inference_field(new):
        # `new` is a fresh instance (unflattening never calls `__init__`), so setting
        # the field on it directly cannot affect `node`.
        set_fields(new, inference=value)
    return new


def inference_mode(pytree: _T, value: bool = True) -> _T:
    """Return a copy of `pytree` with every `inference` flag set to `value`.

    Every [`boxwood.Module`][] in `pytree` (at any depth, including inside lists,
    tuples and dicts) that has a field named `inference`, such as
    [`boxwood.nn.Dropout`][], gets `inference=value`; nothing else changes and
    `pytree` itself is not modified. Because `inference` is a static field, the two
    modes compile separately, once each.

    No `__init__` is re-run: modules are rebuilt the way `jax.tree_util` rebuilds
    them, so custom user modules work unchanged.

    **Arguments:**

    - `pytree`: any pytree (a model). Same parameter names as
        `equinox.nn.inference_mode`.
    - `value`: `True` for inference (evaluation) mode, `False` for training mode.

    **Returns:**

    A pytree of the same type and structure as `pytree` (apart from the flags).

    >>> import boxwood.nn
    >>> model = [boxwood.nn.Dropout(0.1), boxwood.nn.Dropout(0.2)]
    >>> [d.inference for d in boxwood.nn.inference_mode(model)]
    [True, True]
    """
    if not isinstance(value, bool):
        raise TypeError(
            f"inference_mode: `value` must be a Python bool, got {type(value).__name__}."
        )
    return _rebuild(pytree, value)
