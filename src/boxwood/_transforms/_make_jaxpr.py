"""`filter_make_jaxpr`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._module import as_pytree_function
from ._eval_shape import is_struct
from ._split import OutBox, Slots, split_out
from ._wrapped import Wrapped


class _MakeJaxpr(Wrapped):
    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        inputs = Slots((args, kwargs), is_struct)
        box = OutBox()

        def traced(*arrays: Any) -> Any:
            a, kw = inputs.rebuild(arrays)
            return split_out(self.fun(*a, **kw), box)

        jaxpr, out_struct = jax.make_jaxpr(traced, return_shape=True)(*inputs.picked())
        return jaxpr, out_struct, box.get()


def filter_make_jaxpr(fun: Callable) -> Callable[..., tuple[Any, Any, Any]]:
    """`jax.make_jaxpr` for functions of arbitrary Python objects.

    **Arguments:**

    - `fun`: the function, called as `fun(*args, **kwargs)`. Its arguments and its
      output may be any pytrees.

    **Returns:**

    A function that, given example arguments, returns a triple:

    - the `ClosedJaxpr` of `fun`; its inputs are the arrays and
      `jax.ShapeDtypeStruct`s of the arguments, in `jax.tree_util` order. Every
      other leaf (Python numbers included) is static: wrap numbers in arrays to
      trace them.
    - a pytree of `jax.ShapeDtypeStruct`, the arrays of the output (`None` where the
      output has a non-array leaf);
    - the non-array leaves of the output (`None` where it has arrays).

    >>> import boxwood, jax, jax.numpy as jnp
    >>> f = lambda x, name: (jnp.sin(x), name)
    >>> jaxpr, shapes, static = boxwood.filter_make_jaxpr(f)(jnp.zeros(2), "a")
    >>> shapes, static
    ((ShapeDtypeStruct(shape=(2,), dtype=float32), None), (None, 'a'))
    """
    return _MakeJaxpr(as_pytree_function(fun))
