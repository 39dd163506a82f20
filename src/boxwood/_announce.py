"""`announce_jaxpr_p`: the identity primitive behind `debug.announce_transform`,
which reports the transformations applied to it (`boxwood.internal` offers it
under Equinox's name). Below `debug/` and `internal/`, which both use it.

The array leaves go through `announce_jaxpr_p`, whose one parameter `watch` (a `Watch`)
carries the transformations met so far as a path such as `"vmap:jvp:"`. Each
transformation rule binds `announce_jaxpr_p` again with the path extended; running,
tracing and lowering announce the path followed by the stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


@dataclasses.dataclass(frozen=True)
class Watch:
    """What an announcement says: the prefix, the transformations so far (`path`),
    and where it goes (`announce`)."""

    prefix: str
    announce: Callable[[str], Any]
    intermediates: bool
    path: str = ""

    def say(self, stage: str) -> None:
        self.announce(f"{self.prefix}{self.path}{stage}")

    def through(self, transform: str) -> Watch:
        """The watch for the values `transform` makes; announces `transform` when
        `intermediates` asks for it."""
        deeper = dataclasses.replace(self, path=f"{self.path}{transform}:")
        if self.intermediates:
            self.say(transform)
        return deeper


announce_jaxpr_p = Primitive("boxwood_announce")
announce_jaxpr_p.multiple_results = True


def _announced(stage: str) -> Callable:
    def rule(*values: Any, watch: Watch) -> list:
        watch.say(stage)
        return list(values)

    return rule


def _announced_lowering(ctx: Any, *values: Any, watch: Watch) -> list:
    watch.say("mlir")
    return list(values)


def _jvp(primals: Any, tangents: Any, *, watch: Watch) -> tuple:
    inner = watch.through("jvp")
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return announce_jaxpr_p.bind(*primals, watch=inner), announce_jaxpr_p.bind(
        *tangents, watch=inner
    )


def _transpose(cts: Any, *values: Any, watch: Watch) -> list:
    cts = [ad.instantiate_zeros(c) for c in cts]
    return announce_jaxpr_p.bind(*cts, watch=watch.through("transpose"))


def _batch(values: Any, dims: Any, *, watch: Watch) -> tuple:
    return announce_jaxpr_p.bind(*values, watch=watch.through("vmap")), dims


announce_jaxpr_p.def_impl(_announced("impl"))
announce_jaxpr_p.def_abstract_eval(_announced("abstract"))
mlir.register_lowering(announce_jaxpr_p, _announced_lowering)
ad.primitive_jvps[announce_jaxpr_p] = _jvp
ad.primitive_transposes[announce_jaxpr_p] = _transpose
batching.primitive_batchers[announce_jaxpr_p] = _batch
