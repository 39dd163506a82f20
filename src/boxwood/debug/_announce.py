"""`announce_transform`: an identity that reports the transformations applied to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._filters import combine, is_array, partition

announce_p = Primitive("boxwood_announce")
announce_p.multiple_results = True


def _say(xs: tuple, stack: tuple, stage: str, name: str, announce: Callable) -> list:
    announce(name + ":".join((*stack, stage)))
    return list(xs)


def _impl(*xs: Any, stack: tuple, name: str, intermediates: bool, announce: Callable):
    return _say(xs, stack, "impl", name, announce)


def _abstract(
    *xs: Any, stack: tuple, name: str, intermediates: bool, announce: Callable
):
    return _say(xs, stack, "abstract", name, announce)


def _rebind(xs: list, transform: str, params: dict) -> list:
    stack = (*params["stack"], transform)
    if params["intermediates"]:
        params["announce"](params["name"] + ":".join(stack))
    return announce_p.bind(*xs, **{**params, "stack": stack})


def _jvp(primals: list, tangents: list, **params: Any) -> tuple:
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return _rebind(primals, "jvp", params), _rebind(tangents, "jvp", params)


def _transpose(cts: list, *xs: Any, **params: Any) -> list:
    return _rebind([ad.instantiate_zeros(c) for c in cts], "transpose", params)


def _batch(xs: list, dims: list, **params: Any) -> tuple:
    return _rebind(xs, "vmap", params), dims


def _lower(ctx: Any, *xs: Any, stack: tuple, name: str, intermediates: bool,
           announce: Callable) -> tuple:  # fmt: skip
    announce(name + ":".join((*stack, "mlir")))
    return xs


announce_p.def_impl(_impl)
announce_p.def_abstract_eval(_abstract)
ad.primitive_jvps[announce_p] = _jvp
ad.primitive_transposes[announce_p] = _transpose
batching.primitive_batchers[announce_p] = _batch
mlir.register_lowering(announce_p, _lower)


def announce_transform(
    x: Any,
    name: str | None = None,
    intermediates: bool = False,
    announce: Callable[[str], Any] = print,
) -> Any:
    """Return `x` unchanged, announcing each JAX transformation applied to it.

    Each announcement names the transformations so far and the stage reached:
    `vmap:abstract` (traced), `vmap:mlir` (lowered for compilation), `jvp:impl`
    (run eagerly), `jvp:transpose:impl` (the backward pass). For one-off debugging.

    **Arguments:**

    - `x`: any pytree; its arrays are watched.
    - `name`: a prefix shown as `(name) ` before each announcement.
    - `intermediates`: also announce each transformation as it starts.
    - `announce`: the function called with each announcement; `print` by default.

    **Returns:**

    `x`.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> f = lambda x: boxwood.debug.announce_transform(x, name="x")
    >>> _ = jax.jit(jax.vmap(f))(jnp.ones(2))
    (x) vmap:abstract
    (x) vmap:mlir
    """
    prefix = "" if name is None else f"({name}) "
    arrays, others = partition(x, is_array)
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    leaves = announce_p.bind(
        *leaves, stack=(), name=prefix, intermediates=intermediates, announce=announce
    )
    return combine(jax.tree_util.tree_unflatten(treedef, leaves), others)
