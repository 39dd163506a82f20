"""Bound methods of any pytree, as pytrees, for the transformations.

A method read on a boxwood module is already a pytree: a `BoundMethod`
(`_module.py`). The transformations (`filter_jit`, `filter_grad`, `filter_vmap`,
...) call `as_pytree_function` on the function they wrap so that the bound method
of any other pytree node (an Equinox module, a registered class) is one too: its
arrays are traced, not baked in as constants.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax

from ._module import BoundMethod, Module


def _is_pytree_node(x: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(x, is_leaf=lambda y: y is not x)
    return not (len(leaves) == 1 and leaves[0] is x)


def as_pytree_function(fun: Callable) -> Callable:
    """Turn `obj.method` into `BoundMethod(method, obj)` when `obj` is a pytree node.

    **Arguments:**

    - `fun`: any callable.

    **Returns:**

    A `BoundMethod` for the bound method of a module or other pytree node, else
    `fun` itself.
    """
    if isinstance(fun, types.MethodType) and not isinstance(fun.__self__, type):
        if isinstance(fun.__self__, Module) or _is_pytree_node(fun.__self__):
            return BoundMethod(fun.__func__, fun.__self__)
    return fun
