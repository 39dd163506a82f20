"""`closure_to_pytree`: functions whose closed-over values are pytree leaves."""

from __future__ import annotations

import types
from typing import Any

import jax


class _Recipe:
    """The fixed part of a function: its code, globals, name and defaults, kept as
    the static part of a pytree. Two recipes are equal when they would build the
    same function from the same cell contents (same code and defaults, the same
    globals dictionary), whichever function object they were taken from."""

    __slots__ = ("function",)

    def __init__(self, function: types.FunctionType) -> None:
        self.function = function

    def _identity(self) -> tuple:
        f = self.function
        keywords = sorted((f.__kwdefaults__ or {}).items())
        return f.__code__, id(f.__globals__), f.__defaults__, keywords

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Recipe) and self._identity() == other._identity()

    def __hash__(self) -> int:
        # defaults may be unhashable; the code alone tells most functions apart
        return hash((self.function.__code__, id(self.function.__globals__)))

    def build(self, contents: tuple) -> types.FunctionType:
        """The function, closing over `contents` (one value per free variable)."""
        f = self.function
        cells = tuple(map(types.CellType, contents)) if contents else None
        built = types.FunctionType(
            f.__code__, f.__globals__, f.__name__, f.__defaults__, cells
        )
        built.__kwdefaults__ = f.__kwdefaults__
        return built


@jax.tree_util.register_pytree_node_class
class _PytreeFunction:
    """A function as a pytree: its closed-over values are the children, its
    `_Recipe` the static part. Calling it calls the function rebuilt around the
    current children (which a transformation may have replaced by tracers)."""

    # Weakly referable, as Equinox's result (a Module) is: optimistix 0.1.0's
    # `test_minimise`, after other tests in one process, failed with "cannot create
    # weak reference to '_PytreeFunction' object"
    # (tests/internal/test_internal_misc.py::test_closure_to_pytree_details).
    __slots__ = ("recipe", "contents", "__weakref__")

    def __init__(self, recipe: _Recipe, contents: tuple) -> None:
        self.recipe, self.contents = recipe, contents

    @classmethod
    def of(cls, function: types.FunctionType) -> _PytreeFunction:
        cells = function.__closure__ or ()
        contents = tuple(closure_to_pytree(c.cell_contents) for c in cells)
        return cls(_Recipe(function), contents)

    def tree_flatten(self) -> tuple:
        return (self.contents,), self.recipe

    @classmethod
    def tree_unflatten(cls, recipe: _Recipe, children: tuple) -> _PytreeFunction:
        return cls(recipe, children[0])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.recipe.build(self.contents)(*args, **kwargs)

    @property
    def __wrapped__(self) -> types.FunctionType:
        return self.recipe.function

    def __repr__(self) -> str:
        return f"closure_to_pytree({self.recipe.function.__qualname__})"


def _as_pytree(leaf: Any) -> Any:
    # Every function, closure or not: two functions made by the same code (e.g.
    # optax's local `init_fn`s) are then equal, so `filter_jit` does not retrace.
    if isinstance(leaf, types.FunctionType):
        return _PytreeFunction.of(leaf)
    return leaf


def closure_to_pytree(tree: Any) -> Any:
    """Replace every function in `tree` by a callable pytree whose leaves are the
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
    return jax.tree_util.tree_map(_as_pytree, tree)
