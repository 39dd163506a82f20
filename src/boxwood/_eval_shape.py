"""`filter_eval_shape`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._jit._bound import as_pytree_function
from ._filters import combine, is_array, partition
from ._partition import OutBox, split_out


def is_struct(x: Any) -> bool:
    """Arrays and `jax.ShapeDtypeStruct`s: the leaves traced abstractly."""
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


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
    dynamic, static = partition((as_pytree_function(fun), args, kwargs), is_struct)
    box = OutBox()

    def run(dyn: Any) -> Any:
        f, a, kw = combine(dyn, static)
        return split_out(f(*a, **kw), box)

    out_dynamic = jax.eval_shape(run, dynamic)
    return combine(out_dynamic, box.get())
