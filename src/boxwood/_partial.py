"""`Partial`: `functools.partial` as a pytree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._module import Module

_Return = TypeVar("_Return")


# Generic in the return type, as Equinox's is: libraries annotate with
# `eqx.Partial[...]` (quax, at import; tests/tree/test_partial.py pins it).
class Partial(Module, Generic[_Return]):
    """Like `functools.partial`, but the function and the partially-applied arguments
    are all pytree children.

    Unlike `jax.tree_util.Partial`, `func` may be any callable, including a module
    (whose arrays then become leaves of the `Partial`).

    >>> import boxwood, jax, jax.numpy as jnp
    >>> shift = boxwood.Partial(jnp.add, jnp.array([1.0, 2.0]))
    >>> shift(jnp.array([10.0, 20.0]))
    Array([11., 22.], dtype=float32)
    >>> jax.tree_util.tree_leaves(shift)
    [<jnp.ufunc 'add'>, Array([1., 2.], dtype=float32)]
    """

    func: Callable[..., _Return]
    args: tuple[Any, ...]
    keywords: dict[str, Any]

    def __init__(self, func: Callable[..., _Return], /, *args: Any, **kwargs: Any):
        """**Arguments:**

        - `func`: the callable to partially apply.
        - `*args`: positional arguments to apply first.
        - `**kwargs`: keyword arguments to apply.
        """
        if not callable(func):
            raise TypeError(
                f"`Partial` needs a callable as its first argument, got "
                f"{type(func).__name__}: {func!r}."
            )
        self.func = func
        self.args = args
        self.keywords = kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> _Return:
        """Call `func(*self.args, *args, **self.keywords, **kwargs)`; as with
        `functools.partial`, keyword arguments given here override stored ones."""
        return self.func(*self.args, *args, **{**self.keywords, **kwargs})
