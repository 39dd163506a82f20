"""`nondifferentiable` and `nondifferentiable_backward`: identities that refuse to be
differentiated.

Both pass the array leaves of their argument through one `jax.custom_jvp` identity,
`_watched`, whose JVP rule hands the tangents to a policy: `_RefuseTangents` raises
at once; `_GuardCotangents` passes them on through `nondifferentiable_backward_p`,
a linear identity whose transpose refuses any cotangent. The primal values never
meet a primitive of boxwood's own.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import Tracer
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._errors import error_if
from .._filters import combine, is_array, partition


def _default_message(name: str | None, what: str, mode: str) -> str:
    subject = "This operation" if name is None else name
    return f"Unexpected {what}. {subject} cannot be differentiated{mode}."


@dataclasses.dataclass(frozen=True)
class _RefuseTangents:
    """Forward mode refused: any tangent is an error when traced."""

    msg: str

    def __call__(self, tangents: list) -> list:
        raise RuntimeError(self.msg)


@dataclasses.dataclass(frozen=True)
class _GuardCotangents:
    """Forward mode allowed; each tangent goes through the guard primitive, whose
    transpose refuses cotangents."""

    msg: str
    symbolic: bool

    def __call__(self, tangents: list) -> list:
        return [self.guard(t) for t in tangents]

    def guard(self, t: Any) -> Any:
        # Only a traced tangent can meet a transposition later. A concrete one
        # (under an eager `jax.jvp`) is returned as it is, keeping its Python type;
        # so is the tangent of an integer, which never gets a cotangent.
        if not isinstance(t, Tracer) or t.dtype == jax.dtypes.float0:
            return t
        return nondifferentiable_backward_p.bind(
            t, msg=self.msg, symbolic=self.symbolic
        )


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _watched(policy: Any, leaves: list) -> list:
    return leaves


@_watched.defjvp
def _watched_jvp(policy: Any, primals: tuple, tangents: tuple) -> tuple:
    return primals[0], policy(tangents[0])


def _watch_arrays(x: Any, policy: Any) -> Any:
    arrays, rest = partition(x, is_array)
    leaves, structure = jax.tree_util.tree_flatten(arrays)
    if not leaves:
        return x
    watched = jax.tree_util.tree_unflatten(structure, _watched(policy, leaves))
    return combine(watched, rest)


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
    if msg is None:
        msg = _default_message(name, "tangent", "")
    return _watch_arrays(x, _RefuseTangents(msg))


def _refuse_cotangent(ct: Any, x: Any, *, msg: str, symbolic: bool) -> list:
    # Only reached for a cotangent that is not a symbolic zero (`ad.deflinear2`
    # answers those itself).
    if symbolic:
        raise RuntimeError(msg)
    # Some zeros are not symbolic by the time they arrive (a `lax.cond` branch
    # gives an array of zeros), so the value itself is checked when it runs.
    return [error_if(ct, jnp.count_nonzero(ct) > 0, msg)]


def _same(x: Any, **params: Any) -> Any:
    return x


nondifferentiable_backward_p = Primitive("boxwood_nondifferentiable_backward")
nondifferentiable_backward_p.def_impl(_same)
nondifferentiable_backward_p.def_abstract_eval(_same)
ad.deflinear2(nondifferentiable_backward_p, _refuse_cotangent)
batching.defvectorized(nondifferentiable_backward_p)
mlir.register_lowering(nondifferentiable_backward_p, lambda ctx, x, **params: [x])


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
    if msg is None:
        msg = _default_message(name, "cotangent", " in reverse mode")
    return _watch_arrays(x, _GuardCotangents(msg, symbolic))
