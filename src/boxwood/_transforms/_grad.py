"""`filter_grad` and `filter_value_and_grad`."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._filters import is_array, is_inexact_array
from .._module import as_pytree_function, field
from .._warnings import user_stacklevel
from ._split import Slots
from ._wrapped import Wrapped

MSG_NO_GRADIENT = (
    "`{name}`: every gradient is None, because the first argument holds no "
    "floating-point array (found: {found}). Only floating-point JAX or NumPy arrays are "
    "differentiated; Python numbers are static values (not traced) and integer or "
    "boolean arrays have no gradient. To differentiate with respect to a number, "
    "pass it as a floating-point array, e.g. `jnp.asarray(x, dtype=float)`."
)


def _why_no_gradient(first: Any) -> str | None:
    """What the first argument holds instead of a floating-point array (for the
    warning), or `None` when it holds nothing one might have meant to
    differentiate (only strings, functions, ...: no warning)."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(first)[0]:
        if isinstance(leaf, (bool, int, float, complex)):
            kind = f"Python {type(leaf).__name__}"
        elif is_array(leaf):
            kind = f"{np.dtype(leaf.dtype).name} array"
        else:
            continue
        found.append(f"{kind} at `args[0]{jax.tree_util.keystr(path)}`")
    if not found:
        return None
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return ", ".join(found[:3]) + more


def _no_first_argument(name: str, kwargs: dict) -> TypeError:
    if kwargs:
        how = (
            f"got only keyword arguments ({', '.join(sorted(kwargs))}). Pass the "
            "first argument by position, not by keyword"
        )
    else:
        how = "got no arguments"
    return TypeError(
        f"Functions wrapped with `{name}` are differentiated with respect to their "
        f"first positional argument, but {how}."
    )


def _is_pair(out: Any) -> bool:
    return isinstance(out, (tuple, list)) and len(out) == 2


def _check_scalar(name: str, value: Any) -> None:
    """A clear error for a non-scalar output (JAX's names neither function nor fix)."""
    shape = getattr(value, "shape", ())
    if shape != ():
        raise TypeError(
            f"`{name}` needs the function to return a scalar (such as a loss), but it "
            f"returned an array of shape {tuple(shape)}. Reduce it first (`.sum()`, "
            "`.mean()`), or use `boxwood.filter_jacrev` for the derivatives of every "
            "output."
        )


def _warn_if_nothing_differentiable(name: str, first: Any) -> None:
    found = _why_no_gradient(first)
    if found is not None:
        warnings.warn(
            MSG_NO_GRADIENT.format(name=name, found=found),
            UserWarning,
            stacklevel=user_stacklevel(),
        )


class _ValueAndGrad(Wrapped):
    has_aux: bool = field(static=True)
    grad_only: bool = field(static=True)
    gradkwargs: tuple = field(static=True, default=())  # sorted (name, value) pairs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = "filter_grad" if self.grad_only else "filter_value_and_grad"
        if not args:
            raise _no_first_argument(name, kwargs)
        slots = Slots(args[0], is_inexact_array)
        if not slots.where:
            _warn_if_nothing_differentiable(name, args[0])

        def evaluate(values: list) -> Any:
            out = self.fun(slots.rebuild(values), *args[1:], **kwargs)
            _check_scalar(name, out[0] if self.has_aux and _is_pair(out) else out)
            return out

        evaluate_and_grad = jax.value_and_grad(
            evaluate, has_aux=self.has_aux, **dict(self.gradkwargs)
        )
        value, grad_values = evaluate_and_grad(slots.picked())
        grads = slots.rebuild(grad_values, others=None)
        if not self.grad_only:
            return value, grads
        return (grads, value[1]) if self.has_aux else grads


def _grad_options(name: str, gradkwargs: dict) -> tuple:
    if "argnums" in gradkwargs:
        raise TypeError(
            f"`{name}` differentiates with respect to the first argument only, so it "
            "takes no `argnums`: pack what to differentiate into a tuple passed first."
        )
    try:
        options = tuple(sorted(gradkwargs.items()))
        hash(options)
    except TypeError:
        raise TypeError(
            f"`{name}`: the options passed on to `jax.value_and_grad` must be "
            f"hashable; got {gradkwargs!r}."
        ) from None
    return options


def filter_value_and_grad(
    fun: Callable | None = None, *, has_aux: bool = False, **gradkwargs: Any
) -> Callable:
    """Make a function that evaluates `fun` and its gradient.

    The gradient is taken with respect to every floating-point array (JAX or NumPy)
    in the first positional argument, which may be any pytree (e.g. a model). All its
    other leaves get `None` as their gradient (with a `UserWarning` when that is
    every leaf holding a number, as for `filter_grad`). Usable as
    `@filter_value_and_grad` or `@filter_value_and_grad(has_aux=True)`.

    **Arguments:**

    - `fun`: the function to differentiate; it must return a scalar (or a pair
      `(scalar, aux)` when `has_aux=True`). A bound method of a module works too:
      the module's arrays are leaves of the returned wrapper.
    - `has_aux`: whether `fun` returns `(value, aux)`.
    - `**gradkwargs`: other options of `jax.value_and_grad` (`holomorphic`,
      `allow_int`, ...).

    **Returns:**

    A function with the arguments of `fun` returning `(value, grads)`, or
    `((value, aux), grads)` when `has_aux=True`. `grads` has the structure of the
    first argument.

    >>> import boxwood, jax.numpy as jnp
    >>> f = boxwood.filter_value_and_grad(lambda p: jnp.sum(p[0] ** 2))
    >>> f((jnp.array([1.0, 2.0]), "tag"))
    (Array(5., dtype=float32), (Array([2., 4.], dtype=float32), None))
    """
    options = _grad_options("filter_value_and_grad", gradkwargs)
    if fun is None:
        return functools.partial(filter_value_and_grad, has_aux=has_aux, **gradkwargs)
    return _ValueAndGrad(as_pytree_function(fun), has_aux, False, options)


def filter_grad(
    fun: Callable | None = None, *, has_aux: bool = False, **gradkwargs: Any
) -> Callable:
    """Make a function that computes the gradient of `fun`.

    The gradient is taken with respect to every floating-point array (JAX or NumPy)
    in the first positional argument, which may be any pytree (e.g. a model). All its
    other leaves (integer arrays, Python numbers, strings, ...) get `None` as their
    gradient; when that makes every gradient `None` (a first argument of Python
    numbers or integer arrays only), a `UserWarning` names those leaves. Usable as
    `@filter_grad` or `@filter_grad(has_aux=True)`.

    To differentiate with respect to several objects, pack them into a tuple passed
    as the first argument.

    **Arguments:**

    - `fun`: the function to differentiate; it must return a scalar (or a pair
      `(scalar, aux)` when `has_aux=True`). For a bound method such as
      `filter_grad(model.loss)`, the gradient is with respect to the first
      *explicit* argument of `loss`; the module's arrays are leaves of the returned
      wrapper (so they are traced, not baked in, by an enclosing `filter_jit`).
    - `has_aux`: whether `fun` returns `(value, aux)`.
    - `**gradkwargs`: other options of `jax.grad` (`holomorphic`, `allow_int`, ...).

    **Returns:**

    A function with the arguments of `fun` returning the gradient (with the
    structure of the first argument), or `(gradient, aux)` when `has_aux=True`.

    >>> import boxwood, jax.numpy as jnp
    >>> grad = boxwood.filter_grad(lambda p, x: jnp.sum(p["w"] * x))
    >>> grad({"w": jnp.array([1.0, 2.0]), "n": 3}, jnp.array([3.0, 4.0]))
    {'n': None, 'w': Array([3., 4.], dtype=float32)}
    """
    options = _grad_options("filter_grad", gradkwargs)
    if fun is None:
        return functools.partial(filter_grad, has_aux=has_aux, **gradkwargs)
    return _ValueAndGrad(as_pytree_function(fun), has_aux, True, options)
