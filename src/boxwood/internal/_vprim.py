"""`create_vprim`: a primitive whose batching rule is derived from its other rules.

Under `vmap`, a primitive made by `create_vprim` becomes a call of `batched_p`, a
primitive that carries the original one, the batch size and where each operand is
batched; its rules are the original rules under `jax.vmap`. `batched_p` is itself
made by `create_vprim`, so nested `vmap`s nest it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

# The rules of every primitive made by `create_vprim`: prim -> (impl, abstract_eval,
# jvp, transpose).
_rules: dict = {}


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
    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose
    batching.fancy_primitive_batchers[prim] = functools.partial(_batch_rule, prim)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=True))
    _rules[prim] = (impl, abstract_eval, jvp, transpose)
    return prim


def _batch_rule(
    vprim: Primitive, axis_data: Any, operands: Any, axes: Any, /, **params: Any
) -> tuple:
    if all(a is None for a in axes):
        out = vprim.bind(*operands, **params)
        return out, [None] * len(out)
    out = batched_p.bind(
        *operands,
        prim=vprim,
        axis_size=axis_data.size,
        axis_name=axis_data.name,
        in_axes=tuple(axes),
        params=tuple(params.items()),
    )
    return out, [0] * len(out)


def _vmap(fn: Callable, in_axes: Any, axis_size: int, axis_name: Any, **kw: Any):
    return jax.vmap(fn, in_axes=in_axes, axis_size=axis_size, axis_name=axis_name, **kw)


def _batched_impl(*operands, prim, axis_size, axis_name, in_axes, params):
    impl = functools.partial(_rules[prim][0], **dict(params))
    return _vmap(impl, in_axes, axis_size, axis_name)(*operands)


def _drop_axis(aval: Any, axis: Any) -> Any:
    if axis is None:
        return aval
    if not isinstance(aval, ShapedArray):
        raise NotImplementedError(f"batched primitive: unsupported operand {aval}.")
    shape = aval.shape[:axis] + aval.shape[axis + 1 :]
    return aval.update(shape=shape)


def _batched_abstract(*avals, prim, axis_size, axis_name, in_axes, params):
    inner = [_drop_axis(a, ax) for a, ax in zip(avals, in_axes)]
    outs = _rules[prim][1](*inner, **dict(params))
    return [o.update(shape=(axis_size, *o.shape)) for o in outs]


def _batched_jvp(primals, tangents, *, prim, axis_size, axis_name, in_axes, params):
    # A symbolic zero tangent is not batched: it stands for the zeros of one
    # element's shape.
    t_axes = [None if type(t) is ad.Zero else ax for t, ax in zip(tangents, in_axes)]
    tangents = [
        ad.Zero(_drop_axis(t.aval, ax)) if type(t) is ad.Zero else t
        for t, ax in zip(tangents, in_axes)
    ]
    jvp = functools.partial(_rules[prim][2], **dict(params))
    return _vmap(jvp, (list(in_axes), t_axes), axis_size, axis_name)(
        list(primals), tangents
    )


def _batched_transpose(cts, *operands, prim, axis_size, axis_name, in_axes, params):
    undefined = [isinstance(x, ad.UndefinedPrimal) for x in operands]
    inner = [
        ad.UndefinedPrimal(_drop_axis(x.aval, ax)) if u else x
        for x, u, ax in zip(operands, undefined, in_axes)
    ]
    op_axes = [None if u else ax for u, ax in zip(undefined, in_axes)]
    cts = [None if type(c) is ad.Zero else c for c in cts]

    def transpose(cts_: list, *ops: Any) -> tuple:
        out = _rules[prim][3](cts_, *ops, **dict(params))
        return tuple(None if type(o) is ad.Zero else o for o in out)

    # Cotangents come back where their operands were batched (an unbatched linear
    # operand gets its cotangent batched along axis 0, summed over by JAX).
    out_axes = tuple(0 if ax is None else ax for ax in in_axes)
    out = _vmap(transpose, (0, *op_axes), axis_size, axis_name, out_axes=out_axes)(
        cts, *inner
    )
    return [_unbatch_ct(o, x, ax) for o, x, ax in zip(out, operands, in_axes)]


def _unbatch_ct(ct: Any, operand: Any, axis: Any) -> Any:
    if ct is None:
        return None
    if axis is None and isinstance(operand, ad.UndefinedPrimal):
        return ct.sum(0)
    return ct


batched_p = create_vprim(
    "boxwood_batched",
    _batched_impl,
    _batched_abstract,
    _batched_jvp,
    _batched_transpose,
)
