"""`create_vprim`: a primitive whose batching rule is derived from its other rules.

Batching such a primitive binds it again, on the batched operands, with one more
`_Level` (the batch size, axis name and where each operand is batched) appended
to its parameter `batched_over`. Every rule then runs the rule it was given under
one `jax.vmap` per level, the first level innermost, so nested `vmap`s, and
`vmap`s inside differentiation, nest without any new primitive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


class _Level(NamedTuple):
    """One `vmap` the primitive was batched by: operand `i` is batched along
    `in_axes[i]` (`None`: not batched); every output along axis 0."""

    size: int
    name: Any
    in_axes: tuple


def _vmap(fn: Callable, level: _Level, in_axes: Any, out_axes: Any = 0) -> Callable:
    return jax.vmap(
        fn,
        in_axes=in_axes,
        out_axes=out_axes,
        axis_size=level.size,
        axis_name=level.name,
    )


def _element_aval(aval: Any, levels: Sequence[_Level], index: int | None) -> Any:
    """`aval` without its batch axes: those of operand `index`, or (for `None`, an
    output) the leading axis of each level."""
    for level in reversed(levels):  # the last level is the outermost `vmap`
        axis = 0 if index is None else level.in_axes[index]
        if axis is not None:
            aval = aval.update(shape=aval.shape[:axis] + aval.shape[axis + 1 :])
    return aval


def _gather(template: Sequence[bool], given: Any, fill: Callable) -> list:
    """A list as long as `template`: the next of `given` where it is true, else
    `fill(i)`."""
    it = iter(given)
    return [next(it) if keep else fill(i) for i, keep in enumerate(template)]


class _Rules:
    """The rules given to `create_vprim`, lifted over `batched_over` levels."""

    def __init__(self, prim: Primitive, impl, abstract_eval, jvp, transpose):
        self.prim = prim
        self.given = (impl, abstract_eval, jvp, transpose)

    def impl(self, *operands: Any, batched_over: tuple = (), **params: Any) -> Any:
        impl = self.given[0]

        def run(*xs: Any) -> Any:
            return impl(*xs, **params)

        for level in batched_over:
            run = _vmap(run, level, level.in_axes)
        return run(*operands)

    def abstract_eval(self, *avals: Any, batched_over: tuple = (), **params):
        inner = [_element_aval(a, batched_over, i) for i, a in enumerate(avals)]
        outs = self.given[1](*inner, **params)
        lead = tuple(level.size for level in reversed(batched_over))
        return [o.update(shape=lead + o.shape) for o in outs]

    def batch(self, axis_data: Any, operands: Any, dims: Any, **params: Any):
        if all(d is None for d in dims):  # JAX asks even when nothing is batched
            outs = self.prim.bind(*operands, **params)
            return outs, [None] * len(outs)
        level = _Level(axis_data.size, axis_data.name, tuple(dims))
        levels = (*params.pop("batched_over", ()), level)
        outs = self.prim.bind(*operands, batched_over=levels, **params)
        return outs, [0] * len(outs)

    def jvp(self, primals: Any, tangents: Any, *, batched_over: tuple = (), **params):
        if not batched_over:
            return self.given[2](primals, tangents, **params)
        # A symbolic zero tangent cannot cross `jax.vmap`: it is rebuilt inside,
        # with the shape of one batch element.
        symbolic = [isinstance(t, ad.Zero) for t in tangents]
        elements = [
            ad.Zero(_element_aval(t.aval, batched_over, i)) if s else None
            for i, (t, s) in enumerate(zip(tangents, symbolic))
        ]

        def run(xs: list, live: list) -> tuple:
            ts = _gather([not s for s in symbolic], live, lambda i: elements[i])
            out, t_out = self.given[2](xs, ts, **params)
            return list(out), [ad.instantiate_zeros(t) for t in t_out]

        for level in batched_over:
            live_axes = [a for a, s in zip(level.in_axes, symbolic) if not s]
            run = _vmap(run, level, (list(level.in_axes), live_axes))
        return run(list(primals), [t for t in tangents if not isinstance(t, ad.Zero)])

    def transpose(self, cts: Any, *operands: Any, batched_over: tuple = (), **params):
        if not batched_over:
            return self.given[3](cts, *operands, **params)
        return _BatchedTranspose(self.given[3], params, batched_over)(cts, operands)


class _BatchedTranspose:
    """A transpose rule run under the `vmap`s of `levels`. The undefined operands
    and the symbolic zero cotangents are rebuilt per batch element inside."""

    def __init__(self, rule: Callable, params: dict, levels: tuple) -> None:
        self.rule, self.params, self.levels = rule, params, levels

    def __call__(self, cts: Any, operands: tuple) -> list:
        linear = [isinstance(x, ad.UndefinedPrimal) for x in operands]
        live_ct = [not isinstance(c, ad.Zero) for c in cts]
        element = [
            ad.UndefinedPrimal(_element_aval(x.aval, self.levels, i)) if u else None
            for i, (x, u) in enumerate(zip(operands, linear))
        ]
        zero_cts = [
            None if live else ad.Zero(_element_aval(c.aval, self.levels, None))
            for c, live in zip(cts, live_ct)
        ]

        def run(live_cts: list, known: list) -> list:
            cts_ = _gather(live_ct, live_cts, lambda i: zero_cts[i])
            ops = _gather([not u for u in linear], known, lambda i: element[i])
            out = self.rule(cts_, *ops, **self.params)
            return [_live_ct(c) if u else None for c, u in zip(out, linear)]

        for level in self.levels:
            run = self._lift(run, level, linear)
        known = [x for x, u in zip(operands, linear) if not u]
        return run([c for c, live in zip(cts, live_ct) if live], known)

    @staticmethod
    def _lift(run: Callable, level: _Level, linear: list) -> Callable:
        known_axes = [a for a, u in zip(level.in_axes, linear) if not u]
        # A cotangent comes back batched as its operand is; for an operand this
        # level does not batch, it comes back batched along 0 and is summed.
        out_axes = [0 if a is None else a for a in level.in_axes]
        lifted = _vmap(run, level, (0, known_axes), out_axes)

        def summed(live_cts: list, known: list) -> list:
            outs = lifted(live_cts, known)
            return [
                o.sum(0) if o is not None and a is None else o
                for o, a in zip(outs, level.in_axes)
            ]

        return summed


def _live_ct(ct: Any) -> Any:
    return None if ct is None or isinstance(ct, ad.Zero) else ct


def create_vprim(
    name: str,
    impl: Callable,
    abstract_eval: Callable,
    jvp: Callable,
    transpose: Callable,
) -> Primitive:
    """A new primitive `name` (with `multiple_results = True`) from its
    implementation, abstract evaluation, JVP and transpose rules, with a batching
    rule that runs those rules under `jax.vmap` (so none needs writing by hand).

    The rules take the signatures JAX gives them: `impl(*operands, **params)`,
    `abstract_eval(*avals, **params)`, `jvp(primals, tangents, **params)` and
    `transpose(cts, *operands, **params)`; wrap pytree rules with
    [`boxwood.internal.filter_primitive_def`][] and friends.
    """
    prim = Primitive(name)
    prim.multiple_results = True
    rules = _Rules(prim, impl, abstract_eval, jvp, transpose)
    prim.def_impl(rules.impl)
    prim.def_abstract_eval(rules.abstract_eval)
    for table, rule in (
        (ad.primitive_jvps, rules.jvp),
        (ad.primitive_transposes, rules.transpose),
        (batching.fancy_primitive_batchers, rules.batch),
    ):
        table[prim] = rule
    mlir.register_lowering(prim, mlir.lower_fun(rules.impl, multiple_results=True))
    return prim
