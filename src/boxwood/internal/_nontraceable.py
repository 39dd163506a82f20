"""`nontraceable` and `nonbatchable`: identities that refuse some transformations.

Each binds a primitive on every array leaf of its argument; the primitive is the
identity when run, traced or lowered, and its rules for the transformations it
refuses raise.
"""

from __future__ import annotations

from typing import Any, NoReturn

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._errors import error_if
from .._filters import combine, is_array, partition


def _identity_primitive(name: str) -> Primitive:
    """A primitive returning its operands as they are, with no rule for any
    transformation yet."""
    prim = Primitive(name)
    prim.def_impl(lambda x, **params: x)
    prim.def_abstract_eval(lambda aval, **params: aval)
    mlir.register_lowering(prim, lambda ctx, x, **params: [x])
    return prim


def _through(prim: Primitive, x: Any, **params: Any) -> Any:
    """`x`, each of its array leaves passed through `prim`."""
    arrays, rest = partition(x, is_array)
    leaves, structure = jax.tree_util.tree_flatten(arrays)
    out = [prim.bind(leaf, **params) for leaf in leaves]
    return combine(jax.tree_util.tree_unflatten(structure, out), rest)


nontraceable_p = _identity_primitive("boxwood_nontraceable")


def _refuse(transform: str, name: str) -> NoReturn:
    raise RuntimeError(
        f"Detected {transform} of {name}, which cannot be transformed. A value "
        "passed to it is probably closed over from an outer `jax.grad`/`jax.vmap` "
        "instead of being passed as an argument."
    )


ad.primitive_jvps[nontraceable_p] = lambda primals, tangents, *, name: _refuse(
    "differentiation", name
)
ad.primitive_transposes[nontraceable_p] = lambda cts, *xs, name: _refuse(
    "transposition", name
)
batching.primitive_batchers[nontraceable_p] = lambda xs, dims, *, name: _refuse(
    "batching", name
)


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
    return _through(nontraceable_p, x, name=name)


nonbatchable_p = _identity_primitive("boxwood_nonbatchable")


def _unbatched(x: Any, axis: int | None, msg: str, allow_constant: bool) -> Any:
    """`x` without its batch axis `axis`, if every batch element is the same."""
    if axis is None:
        return x
    if not allow_constant:
        raise ValueError(msg)
    first = jax.lax.index_in_dim(x, 0, axis, keepdims=False)
    # Checked when the program runs: the values are not known while tracing.
    return error_if(first, jnp.any(x != jnp.expand_dims(first, axis)), msg)


def _nonbatchable_batch(xs: Any, dims: Any, *, msg: str, allow_constant: bool):
    return _unbatched(xs[0], dims[0], msg, allow_constant), None


def _nonbatchable_jvp(primals: Any, tangents: Any, **params: Any) -> tuple:
    # The tangent is left alone: only the value itself must be unbatched.
    return nonbatchable_p.bind(primals[0], **params), tangents[0]


batching.primitive_batchers[nonbatchable_p] = _nonbatchable_batch
ad.primitive_jvps[nonbatchable_p] = _nonbatchable_jvp

_NONBATCHABLE_MESSAGES = {
    False: (
        "Unexpected batch tracer. {name} cannot be vmap'd: its value must be the "
        "same for the whole batch. This is probably an internal error in the "
        "library you are using."
    ),
    True: (
        "Nonconstant batch. {name} was given a batch of values that must all be "
        "equal, and they differ. This is probably an internal error in the "
        "library you are using."
    ),
}


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
    allow = bool(allow_constant_across_batch)
    if msg is None:
        template = _NONBATCHABLE_MESSAGES[allow]
        msg = template.format(name="This operation" if name is None else name)
    return _through(nonbatchable_p, x, msg=msg, allow_constant=allow)
