"""`closure_to_pytree`: functions whose closed-over values are pytree leaves."""

from __future__ import annotations

import types
from typing import Any

import jax

from .._module import Module, field


class _SameFunction:
    """A function compared by what it is made of (code, defaults, globals), so that
    two closures made by the same code have equal pytree structures."""

    __slots__ = ("fn",)

    def __init__(self, fn: types.FunctionType):
        self.fn = fn

    def _key(self) -> tuple:
        f = self.fn
        kwdefaults = tuple(sorted((f.__kwdefaults__ or {}).items()))
        return (f.__code__, f.__defaults__, kwdefaults, id(f.__globals__))

    def __hash__(self) -> int:
        return hash(self._key()[0])

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _SameFunction) and self._key() == other._key()


class _Closure(Module):
    function: _SameFunction = field(static=True)
    contents: tuple

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        f = self.function.fn
        # a function without free variables keeps `__closure__ = None`
        cells = tuple(types.CellType(c) for c in self.contents) or None
        rebuilt = types.FunctionType(
            f.__code__, f.__globals__, f.__name__, f.__defaults__, cells
        )
        rebuilt.__kwdefaults__ = f.__kwdefaults__
        return rebuilt(*args, **kwargs)

    @property
    def __wrapped__(self) -> types.FunctionType:
        return self.function.fn


def _convert(leaf: Any) -> Any:
    # Every function, closure or not: two functions made by the same code (e.g.
    # optax's local `init_fn`s) are then equal, so `filter_jit` does not retrace.
    if isinstance(leaf, types.FunctionType):
        cells = leaf.__closure__ or ()
        contents = tuple(closure_to_pytree(c.cell_contents) for c in cells)
        return _Closure(_SameFunction(leaf), contents)
    return leaf


def closure_to_pytree(tree: Any) -> Any:
    """Replace every function in `tree` by a callable module whose leaves are the
    closed-over values (so `jax.tree_util` and `filter_jit` see them), and which
    equals any other function made by the same code with equal closed-over values.

    Only closures are converted (a nested function's free variables), not globals.

    **Arguments:**

    - `tree`: any pytree.

    **Returns:**

    A copy of `tree` with its closures converted.

    >>> import jax, jax.numpy as jnp
    >>> from boxwood.internal import closure_to_pytree
    >>> def make():
    ...     a = jnp.array(2.0)
    ...     return closure_to_pytree(lambda x: a * x)
    >>> f = make()
    >>> jax.tree_util.tree_leaves(f), f(3.0)
    ([Array(2., dtype=float32, weak_type=True)], Array(6., dtype=float32, weak_type=True))
    """
    return jax.tree_util.tree_map(_convert, tree)
