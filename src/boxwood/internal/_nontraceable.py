"""`nontraceable` and `nonbatchable`: identities that refuse some transformations."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._errors import error_if
from .._filters import combine, is_array, partition


def _map_arrays(bind: Any, x: Any) -> Any:
    arrays, others = partition(x, is_array)
    return combine(jax.tree_util.tree_map(bind, arrays), others)


def _identity(x: Any, **params: Any) -> Any:
    return x


nontraceable_p = Primitive("boxwood_nontraceable")
nontraceable_p.def_impl(_identity)
nontraceable_p.def_abstract_eval(_identity)
mlir.register_lowering(
    nontraceable_p, mlir.lower_fun(_identity, multiple_results=False)
)


def _refuse(transform: str) -> Any:
    def rule(*args: Any, name: str) -> Any:
        raise RuntimeError(
            f"Detected {transform} of {name}, which cannot be transformed. A value "
            "passed to it is probably closed over from an outer `jax.grad`/`jax.vmap` "
            "instead of being passed as an argument."
        )

    return rule


ad.primitive_jvps[nontraceable_p] = _refuse("differentiation")
ad.primitive_transposes[nontraceable_p] = _refuse("transposition")
batching.primitive_batchers[nontraceable_p] = _refuse("batching")


def nontraceable(x: Any, *, name: str = "nontraceable operation") -> Any:
    """Identity on the pytree `x` that raises a `RuntimeError` (naming `name`) if
    its array leaves are differentiated, transposed or batched.

    Placed at the end of a primitive's implementation, it catches tracers of an
    outer transformation that reached the implementation by closure.

    >>> import jax
    >>> from boxwood.internal import nontraceable
    >>> try:
    ...     jax.vmap(lambda x: nontraceable(x, name="my_op"))(jax.numpy.ones(2))
    ... except RuntimeError as e:
    ...     print(str(e).split(",")[0])
    Detected batching of my_op
    """
    return _map_arrays(functools.partial(nontraceable_p.bind, name=name), x)


nonbatchable_p = Primitive("boxwood_nonbatchable")
nonbatchable_p.def_impl(_identity)
nonbatchable_p.def_abstract_eval(_identity)
mlir.register_lowering(
    nonbatchable_p, mlir.lower_fun(_identity, multiple_results=False)
)


def _nonbatchable_batch(xs: tuple, dims: tuple, *, msg: str, allow_constant: bool):
    (x,), (d,) = xs, dims
    if not allow_constant:
        raise ValueError(msg)
    # Every batch element must hold the same value: checked when the program runs.
    x = error_if(x, jnp.any(jnp.min(x, axis=d) != jnp.max(x, axis=d)), msg)
    return jnp.take(x, 0, axis=d), None


def _nonbatchable_jvp(primals: tuple, tangents: tuple, **params: Any) -> tuple:
    (x,), (t,) = primals, tangents
    return nonbatchable_p.bind(x, **params), t


batching.primitive_batchers[nonbatchable_p] = _nonbatchable_batch
ad.primitive_jvps[nonbatchable_p] = _nonbatchable_jvp


def nonbatchable(
    x: Any,
    *,
    name: str | None = None,
    msg: str | None = None,
    allow_constant_across_batch: bool = False,
) -> Any:
    """Identity on the pytree `x` that refuses `vmap`: batching one of its array
    leaves raises a `ValueError` when traced.

    **Arguments:**

    - `x`: any pytree.
    - `name`: the operation named in the error message.
    - `msg`: the whole error message, instead.
    - `allow_constant_across_batch`: instead of raising, accept a batched value
      whose elements are all equal (checked at run time with
      [`boxwood.error_if`][]) and return it unbatched.

    >>> import jax, jax.numpy as jnp
    >>> from boxwood.internal import nonbatchable
    >>> f = lambda x: nonbatchable(x, allow_constant_across_batch=True)
    >>> jax.vmap(f, out_axes=None)(jnp.array([3, 3]))
    Array(3, dtype=int32)
    """
    if msg is None:
        name = "This operation" if name is None else name
        if allow_constant_across_batch:
            msg = (
                f"Nonconstant batch. {name} has received a batch of values that were "
                "expected to be constant. This is probably an internal error in the "
                "library you are using."
            )
        else:
            msg = (
                f"Unexpected batch tracer. {name} cannot be vmap'd. This is probably "
                "an internal error in the library you are using."
            )
    bind = functools.partial(
        nonbatchable_p.bind, msg=msg, allow_constant=allow_constant_across_batch
    )
    return _map_arrays(bind, x)
