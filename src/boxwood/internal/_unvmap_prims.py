"""`unvmap_any_p`, `unvmap_all_p`, `unvmap_max_p`: reductions over every element,
batch axes included, as primitives (for code binding them directly; the functions
`boxwood.internal.unvmap_any` and friends give the same results)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


def _reduction_primitive(name: str, reduce: Callable) -> Primitive:
    prim = Primitive(name)

    def impl(x: Any) -> Any:
        return reduce(jnp.asarray(x))

    def batch(xs: tuple, dims: tuple) -> tuple:
        # The batch axis is one more axis to reduce over: the result is unbatched.
        return prim.bind(xs[0]), None

    def abstract(x: Any) -> Any:
        # The dtype is the reduction's own: `bool` for `any`/`all` of numbers too.
        out = jax.eval_shape(reduce, jax.ShapeDtypeStruct(x.shape, x.dtype))
        return ShapedArray((), out.dtype)

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract)
    batching.primitive_batchers[prim] = batch
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))
    return prim


unvmap_any_p = _reduction_primitive("boxwood_unvmap_any", jnp.any)
unvmap_all_p = _reduction_primitive("boxwood_unvmap_all", jnp.all)
unvmap_max_p = _reduction_primitive("boxwood_unvmap_max", jnp.max)


def _max_jvp(primals: tuple, tangents: tuple) -> tuple:
    # Not differentiable: its value is used as a loop bound or a flag.
    (x,), _ = primals, tangents
    out = unvmap_max_p.bind(x)
    return out, ad.Zero(jax.typeof(out).to_tangent_aval())


ad.primitive_jvps[unvmap_max_p] = _max_jvp
