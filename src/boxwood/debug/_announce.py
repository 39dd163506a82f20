"""`announce_transform`: an identity that reports the transformations applied to it.

The array leaves go through `announce_p`, whose one parameter `watch` (a `_Watch`)
carries the transformations met so far as a path such as `"vmap:jvp:"`. Each
transformation rule binds `announce_p` again with the path extended; running,
tracing and lowering announce the path followed by the stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._filters import combine, is_array, partition


@dataclasses.dataclass(frozen=True)
class _Watch:
    prefix: str
    announce: Callable[[str], Any]
    intermediates: bool
    path: str = ""

    def say(self, stage: str) -> None:
        self.announce(f"{self.prefix}{self.path}{stage}")

    def through(self, transform: str) -> _Watch:
        """The watch for the values `transform` makes; announces `transform` when
        `intermediates` asks for it."""
        deeper = dataclasses.replace(self, path=f"{self.path}{transform}:")
        if self.intermediates:
            self.say(transform)
        return deeper


announce_p = Primitive("boxwood_announce")
announce_p.multiple_results = True


def _announced(stage: str) -> Callable:
    def rule(*values: Any, watch: _Watch) -> list:
        watch.say(stage)
        return list(values)

    return rule


def _announced_lowering(ctx: Any, *values: Any, watch: _Watch) -> list:
    watch.say("mlir")
    return list(values)


def _jvp(primals: Any, tangents: Any, *, watch: _Watch) -> tuple:
    inner = watch.through("jvp")
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return announce_p.bind(*primals, watch=inner), announce_p.bind(
        *tangents, watch=inner
    )


def _transpose(cts: Any, *values: Any, watch: _Watch) -> list:
    cts = [ad.instantiate_zeros(c) for c in cts]
    return announce_p.bind(*cts, watch=watch.through("transpose"))


def _batch(values: Any, dims: Any, *, watch: _Watch) -> tuple:
    return announce_p.bind(*values, watch=watch.through("vmap")), dims


announce_p.def_impl(_announced("impl"))
announce_p.def_abstract_eval(_announced("abstract"))
mlir.register_lowering(announce_p, _announced_lowering)
ad.primitive_jvps[announce_p] = _jvp
ad.primitive_transposes[announce_p] = _transpose
batching.primitive_batchers[announce_p] = _batch


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
    arrays, rest = partition(x, is_array)
    leaves, structure = jax.tree_util.tree_flatten(arrays)
    prefix = "" if name is None else f"({name}) "
    watch = _Watch(prefix, announce, bool(intermediates))
    out = announce_p.bind(*leaves, watch=watch)
    return combine(jax.tree_util.tree_unflatten(structure, out), rest)
