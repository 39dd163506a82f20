"""`module_update_wrapper`: `functools.update_wrapper` for modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

WRAPPER_NAMES = ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__")


def module_update_wrapper(wrapper: Any, wrapped: Callable | None = None) -> Any:
    """A copy of the module `wrapper` that looks like the function it wraps, as
    `functools.update_wrapper` does (without modifying `wrapper`).

    **Arguments:**

    - `wrapper`: a module whose class defines `__wrapped__` as a property.
    - `wrapped`: the wrapped callable; by default `wrapper.__wrapped__`.

    **Returns:**

    A copy of `wrapper` with `__module__`, `__name__`, `__qualname__`, `__doc__` and
    `__annotations__` taken from `wrapped` (those the class defines as properties
    already follow it). The copy keeps them until it is flattened: a copy rebuilt by
    `jax.tree_util` shows the class's own.

    >>> import boxwood
    >>> class Wrapper(boxwood.Module):
    ...     fn: object
    ...     def __call__(self, *args):
    ...         return self.fn(*args)
    ...     @property
    ...     def __wrapped__(self):
    ...         return self.fn
    >>> def double(x):
    ...     "Twice x."
    ...     return 2 * x
    >>> w = boxwood.module_update_wrapper(Wrapper(double))
    >>> w.__name__, w.__doc__, w(3)
    ('double', 'Twice x.', 6)
    """
    if not isinstance(getattr(type(wrapper), "__wrapped__", None), property):
        raise ValueError(
            f"`module_update_wrapper`: `{type(wrapper).__name__}` must define "
            "`__wrapped__` as a property returning the wrapped callable."
        )
    source = wrapper.__wrapped__ if wrapped is None else wrapped
    own = type(wrapper)
    copied = {
        name: getattr(source, name)
        for name in WRAPPER_NAMES
        if not isinstance(getattr(own, name, None), property) and hasattr(source, name)
    }
    copy = jax.tree_util.tree_map(lambda leaf: leaf, wrapper)  # a new instance
    for name, value in copied.items():
        object.__setattr__(copy, name, value)
    return copy
