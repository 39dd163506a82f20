"""Bound methods of modules, as pytrees.

Module methods are plain functions (attribute access stays as cheap as on any
object), so `model.__call__` is an ordinary `types.MethodType`. The transformations
call `as_pytree_function` on the function they wrap: a bound method of a pytree
becomes a `BoundMethod` module whose `instance` is a dynamic field, so the module's
arrays are traced (not baked in as constants) and the bound methods of two modules
with the same structure share compiled code.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax

from .._module import Module, field


class BoundMethod(Module):
    """`instance.func` as a pytree: `instance` is a child, `func` is static."""

    func: Callable = field(static=True)
    instance: Any

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(self.instance, *args, **kwargs)

    @property
    def __self__(self) -> Any:
        return self.instance

    @property
    def __func__(self) -> Callable:
        return self.func


def _is_pytree_node(x: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(x, is_leaf=lambda y: y is not x)
    return not (len(leaves) == 1 and leaves[0] is x)


def as_pytree_function(fun: Callable) -> Callable:
    """Turn `obj.method` into `BoundMethod(method, obj)` when `obj` is a pytree node."""
    if isinstance(fun, types.MethodType) and not isinstance(fun.__self__, type):
        if isinstance(fun.__self__, Module) or _is_pytree_node(fun.__self__):
            return BoundMethod(fun.__func__, fun.__self__)
    return fun
