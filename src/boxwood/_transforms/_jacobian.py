"""`filter_jacfwd`, `filter_jacrev`, `filter_hessian`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._filters import is_array, is_inexact_array
from .._module import as_pytree_function, field
from ._split import OutBox, Slots
from ._wrapped import Wrapped


class _Jacobian(Wrapped):
    has_aux: bool = field(static=True)
    reverse: bool = field(static=True)

    def __call__(self, x: Any, /, *args: Any, **kwargs: Any) -> Any:
        slots = Slots(x, is_inexact_array)
        box = OutBox()

        def evaluate(values: list) -> tuple:
            result = self.fun(slots.rebuild(values), *args, **kwargs)
            out, aux = result if self.has_aux else (result, None)
            aux_slots = Slots(aux, is_array)  # non-array aux goes around JAX
            box.put((jax.tree_util.tree_structure(out), aux_slots))
            return out, aux_slots.picked()

        differentiate = jax.jacrev if self.reverse else jax.jacfwd
        jac, aux_arrays = differentiate(evaluate, has_aux=True)(slots.picked())
        # each output leaf's Jacobian is a list (one entry per differentiated
        # input leaf): give it the first argument's structure
        out_def, aux_slots = box.get()
        per_output = [
            slots.rebuild(row, others=None) for row in out_def.flatten_up_to(jac)
        ]
        jac = out_def.unflatten(per_output)
        return (jac, aux_slots.rebuild(aux_arrays)) if self.has_aux else jac


_DOC_TAIL = """
    **Arguments:**

    - `fun`: the function; it is differentiated with respect to the floating-point
      arrays of its first argument (any pytree). Its output must be a pytree of
      arrays (or `(output, aux)` when `has_aux=True`).
    - `has_aux`: whether `fun` returns `(output, aux)`.

    **Returns:**

    A function with the arguments of `fun` returning the {what} (with `None` for
    the first argument's non-floating-point leaves), or `({what}, aux)`."""


def filter_jacfwd(fun: Callable, has_aux: bool = False) -> Callable:
    return _Jacobian(as_pytree_function(fun), has_aux, False)


def filter_jacrev(fun: Callable, has_aux: bool = False) -> Callable:
    return _Jacobian(as_pytree_function(fun), has_aux, True)


def filter_hessian(fun: Callable, has_aux: bool = False) -> Callable:
    return filter_jacfwd(filter_jacrev(fun, has_aux=has_aux), has_aux=has_aux)


filter_jacfwd.__doc__ = (
    """The Jacobian of `fun` by forward-mode autodiff, for pytree inputs.
"""
    + _DOC_TAIL.format(what="Jacobian")
    + """

    >>> import boxwood, jax.numpy as jnp
    >>> jac = boxwood.filter_jacfwd(lambda p: p["w"] ** 2)
    >>> jac({"w": jnp.array([1.0, 2.0]), "act": "relu"})["w"]
    Array([[2., 0.],
           [0., 4.]], dtype=float32)
    """
)
filter_jacrev.__doc__ = (
    """The Jacobian of `fun` by reverse-mode autodiff, for pytree inputs.
"""
    + _DOC_TAIL.format(what="Jacobian")
    + """

    >>> import boxwood, jax.numpy as jnp
    >>> jac = boxwood.filter_jacrev(lambda p: p["w"] ** 2)
    >>> jac({"w": jnp.array([1.0, 2.0]), "act": "relu"})["w"]
    Array([[2., 0.],
           [0., 4.]], dtype=float32)
    """
)
filter_hessian.__doc__ = (
    """The Hessian of a scalar `fun` (forward over reverse), for pytree inputs.
"""
    + _DOC_TAIL.format(what="Hessian")
    + """

    >>> import boxwood, jax.numpy as jnp
    >>> hess = boxwood.filter_hessian(lambda p: jnp.sum(p["w"] ** 3))
    >>> hess({"w": jnp.array([1.0, 2.0]), "act": "relu"})["w"]["w"]
    Array([[ 6.,  0.],
           [ 0., 12.]], dtype=float32)
    """
)
