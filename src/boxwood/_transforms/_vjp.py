"""`filter_vjp`: reverse-mode products on any pytree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._filters import is_inexact_array
from .._tracebacks import hiding_own_frames
from ._split import Sieve


@hiding_own_frames
def filter_vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple:
    """`jax.vjp` for functions of arbitrary pytrees.

    Floating-point arrays of `primals` are differentiated; every other leaf is
    passed through as it is.

    **Arguments:**

    - `fun`: the function, called as `fun(*primals)`; its output may be any pytree
      (or `(output, aux)` when `has_aux=True`).
    - `*primals`: its arguments.
    - `has_aux`: whether `fun` returns `(output, aux)`.

    **Returns:**

    `(output, vjp_fn)`, or `(output, vjp_fn, aux)` when `has_aux=True`. `vjp_fn`
    takes a cotangent with the structure of `output` (arrays for its floating-point
    arrays, `None` elsewhere) and returns a tuple with one cotangent per primal
    (`None` for its non-floating-point leaves).

    >>> import boxwood, jax.numpy as jnp
    >>> out, vjp_fn = boxwood.filter_vjp(lambda x, n: x * n, jnp.array(2.0), 3)
    >>> vjp_fn(jnp.array(1.0))
    (Array(3., dtype=float32, weak_type=True), None)
    """
    inputs = Sieve(primals, is_inexact_array)

    def of_differentiable(*kept: Any) -> tuple[Any, tuple[Sieve, Any]]:
        result = fun(*inputs.fill(kept))
        value, aux = result if has_aux else (result, None)
        outputs = Sieve(value, is_inexact_array)
        return outputs.kept, (outputs, aux)

    kept_out, vjp_fn, (outputs, aux) = jax.vjp(
        of_differentiable, *inputs.kept, has_aux=True
    )
    out = outputs.fill(kept_out)
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)
