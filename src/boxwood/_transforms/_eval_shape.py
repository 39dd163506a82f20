"""`filter_eval_shape`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._filters import is_array
from .._module import as_pytree_function
from .._tracebacks import hiding_own_frames
from ._split import OutBox, Slots


def is_struct(x: Any) -> bool:
    """Arrays and `jax.ShapeDtypeStruct`s: the leaves traced abstractly."""
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


@hiding_own_frames
def filter_eval_shape(fun: Callable, *args: Any, **kwargs: Any) -> Any:
    """`jax.eval_shape` for functions of arbitrary Python objects.

    Runs `fun(*args, **kwargs)` abstractly: nothing is computed. Arrays and
    `jax.ShapeDtypeStruct`s in the arguments (and in `fun`, when it is a module) are
    traced; every other leaf is passed as it is.

    **Arguments:**

    - `fun`: the function to evaluate.
    - `*args`, `**kwargs`: its arguments.

    **Returns:**

    The output of `fun`, with `jax.ShapeDtypeStruct`s in place of its arrays; its
    non-array leaves are returned as they are. For instance, this gives the shapes
    of a model's parameters without allocating them:

    >>> import boxwood, jax, jax.numpy as jnp
    >>> def make(key):
    ...     return {"w": jax.random.normal(key, (1000, 1000)), "act": "relu"}
    >>> boxwood.filter_eval_shape(make, jax.random.key(0))
    {'act': 'relu', 'w': ShapeDtypeStruct(shape=(1000, 1000), dtype=float32)}
    """
    inputs = Slots((as_pytree_function(fun), args, kwargs), is_struct)
    box = OutBox()

    def abstract(values: list) -> list:
        f, a, kw = inputs.rebuild(values)
        outputs = Slots(f(*a, **kw), is_array)  # its other leaves go around JAX
        box.put(outputs)
        return outputs.picked()

    shapes = jax.eval_shape(abstract, inputs.picked())
    return box.get().rebuild(shapes)
