"""`nondifferentiable` and `nondifferentiable_backward`: identities that refuse to be
differentiated."""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.core import Tracer
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._errors import error_if
from .._filters import combine, is_array, partition


def _message(name: str | None, msg: str | None, what: str) -> str:
    if msg is not None:
        return msg
    return f"Unexpected {what}. {name or 'This operation'} cannot be differentiated" + (
        " in reverse mode." if what == "cotangent" else "."
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _refuse_jvp(msg: str, arrays: list) -> list:
    return arrays


@_refuse_jvp.defjvp
def _refuse_jvp_rule(msg: str, primals: tuple, tangents: tuple) -> tuple:
    raise RuntimeError(msg)


def nondifferentiable(
    x: Any, *, name: str | None = None, msg: str | None = None
) -> Any:
    """Return `x` unchanged; raise a `RuntimeError` if it is differentiated (forward
    or reverse mode) with respect to its arrays.

    **Arguments:**

    - `x`: any pytree.
    - `name`: the operation's name, for the default message.
    - `msg`: the whole message instead.

    **Returns:**

    `x`.

    >>> import jax
    >>> from boxwood.internal import nondifferentiable
    >>> try:
    ...     jax.grad(lambda x: nondifferentiable(x, name="`round`"))(1.0)
    ... except RuntimeError as e:
    ...     print(str(e).splitlines()[0])
    Unexpected tangent. `round` cannot be differentiated.
    """
    arrays, others = partition(x, is_array)
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    leaves = _refuse_jvp(_message(name, msg, "tangent"), leaves)
    return combine(jax.tree_util.tree_unflatten(treedef, leaves), others)


nondifferentiable_backward_p = Primitive("boxwood_nondifferentiable_backward")


def _identity(x: Any, *, msg: str, symbolic: bool) -> Any:
    return x


def _jvp(primals: tuple, tangents: tuple, *, msg: str, symbolic: bool) -> tuple:
    (x,), (t,) = primals, tangents
    bind = functools.partial(
        nondifferentiable_backward_p.bind, msg=msg, symbolic=symbolic
    )
    # A concrete value (a Python float under `jax.jvp`) comes back as it is, as in
    # Equinox: only a traced one can meet a reverse pass, so only those are bound.
    t = ad.instantiate_zeros(t)
    return tuple(bind(v) if isinstance(v, Tracer) else v for v in (x, t))


def _transpose(ct: Any, x: Any, *, msg: str, symbolic: bool) -> list:
    if type(ct) is ad.Zero:
        return [ct]
    if symbolic:
        raise RuntimeError(msg)
    # Some cotangents are zeros that are not symbolic (they went through a
    # `lax.cond`), so a nonzero value is checked when the program runs.
    return [error_if(ct, (ct != 0).any(), msg)]


def _batch(xs: tuple, dims: tuple, *, msg: str, symbolic: bool) -> tuple:
    return nondifferentiable_backward_p.bind(xs[0], msg=msg, symbolic=symbolic), dims[0]


nondifferentiable_backward_p.def_impl(_identity)
nondifferentiable_backward_p.def_abstract_eval(_identity)
ad.primitive_jvps[nondifferentiable_backward_p] = _jvp
ad.primitive_transposes[nondifferentiable_backward_p] = _transpose
batching.primitive_batchers[nondifferentiable_backward_p] = _batch
mlir.register_lowering(
    nondifferentiable_backward_p, mlir.lower_fun(_identity, multiple_results=False)
)


def nondifferentiable_backward(
    x: Any, name: str | None = None, msg: str | None = None, symbolic: bool = True
) -> Any:
    """Return `x` unchanged; forward-mode differentiation passes through, but a
    cotangent reaching it (reverse mode) raises a `RuntimeError`.

    **Arguments:**

    - `x`: any pytree.
    - `name`, `msg`: as for [`boxwood.internal.nondifferentiable`][].
    - `symbolic`: `True` raises when the program is traced, for any cotangent that
      is not a symbolic zero; `False` checks at run time (with
      [`boxwood.error_if`][]) that the cotangent is all zeros.

    **Returns:**

    `x`.
    """
    arrays, others = partition(x, is_array)
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    message = _message(name, msg, "cotangent")
    leaves = [
        nondifferentiable_backward_p.bind(a, msg=message, symbolic=symbolic)
        for a in leaves
    ]
    return combine(jax.tree_util.tree_unflatten(treedef, leaves), others)
