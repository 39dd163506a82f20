"""`noinline`: call a function as one primitive of the enclosing program."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import ShapedArray

from .._eval_shape import filter_eval_shape
from .._filters import combine, is_array, partition
from .._filters import filter as filter_tree
from .._jit import filter_jit
from .._jvp import filter_jvp
from .._module import Module, field
from .._partition import follow_wrapped_annotations, wrapped_qualname
from ._finalise import register_impl_finalisation
from ._misc import cached_filter_eval_shape
from ._primitive import (
    filter_primitive_bind,
    filter_primitive_def,
    filter_primitive_jvp,
    filter_primitive_transpose,
)
from ._vprim import create_vprim


def _call(fn: Any, args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


def _impl(fn: Any, abstract_fn: Any, args: tuple, kwargs: dict) -> Any:
    return filter_jit(_call)(fn, args, kwargs)


def _to_struct(x: Any) -> Any:
    return jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, ShapedArray) else x


def _abstract(fn: Any, abstract_fn: Any, args: tuple, kwargs: dict) -> Any:
    fn, args, kwargs = jax.tree_util.tree_map(_to_struct, (fn, args, kwargs))
    if abstract_fn is None:
        call, call_args, kwargs = _call, (fn, args, kwargs), {}
    else:
        call, call_args = abstract_fn, (filter_tree(fn, is_array), *args)
    try:  # traced once per signature, where the arguments are hashable
        out = cached_filter_eval_shape(call, *call_args, **kwargs)
    except TypeError:
        out = filter_eval_shape(call, *call_args, **kwargs)
    return jax.tree_util.tree_map(_to_aval, out)


def _to_aval(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return ShapedArray(x.shape, x.dtype)
    return x


def _zeros_for_none(primal: Any, tangent: Any) -> Any:
    if tangent is None and is_array(primal):
        return jnp.zeros_like(primal)
    return tangent


def _jvp(primals: tuple, tangents: tuple) -> tuple:
    fn, abstract_fn, args, kwargs = primals
    t_fn, _, t_args, t_kwargs = tangents
    p = (fn, args, kwargs)
    t = jax.tree_util.tree_map(
        _zeros_for_none, p, (t_fn, t_args, t_kwargs), is_leaf=lambda x: x is None
    )
    return filter_jvp(_call, p, t)


def _transpose(inputs: tuple, cts_out: Any) -> Any:
    raise NotImplementedError(
        "`noinline`: the primitive was transposed directly. Differentiate the "
        "function calling it instead (its JVP uses ordinary operations)."
    )


noinline_p = create_vprim(
    "boxwood_noinline",
    filter_primitive_def(_impl),
    filter_primitive_def(_abstract),
    filter_primitive_jvp(_jvp),
    filter_primitive_transpose(_transpose),
)
register_impl_finalisation(noinline_p)


class _NoInline(Module):
    # Only the function's arrays are leaves: the rest (the code) is static, so
    # that the wrapper can be passed through `jax.jit`.
    fn_arrays: Any
    fn_static: Any = field(static=True)
    abstract_fn: Any = field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = combine(self.fn_arrays, self.fn_static)
        return filter_primitive_bind(noinline_p, fn, self.abstract_fn, args, kwargs)

    # It looks like the function it wraps (`abstract_fn` when given, as in Equinox),
    # as `functools.wraps` would make it.
    @property
    def __wrapped__(self) -> Any:
        if self.abstract_fn is not None:
            return self.abstract_fn
        return combine(self.fn_arrays, self.fn_static)

    @property
    def __name__(self) -> str:  # type: ignore[override]
        return getattr(self.__wrapped__, "__name__", type(self).__name__)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return getattr(self.__wrapped__, "__doc__", None)

    def __getattr__(self, name: str) -> Any:
        if name == "__qualname__":  # see `Wrapped.__getattr__`
            return wrapped_qualname(self)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}"
        )


follow_wrapped_annotations(_NoInline)


def noinline(fn: Callable, abstract_fn: Callable | None = None) -> Callable:
    """`fn` as a single operation of the programs calling it: its body is compiled
    once as its own function instead of being traced into each caller (saving
    compile time for a function called many times, at some run-time cost).

    **Arguments:**

    - `fn`: any callable pytree; its arrays are inputs of the operation.
    - `abstract_fn`: gives the output's shapes and dtypes, called as
      `filter_eval_shape(abstract_fn, filter(fn, is_array), *args, **kwargs)`;
      by default `fn` itself is traced for them.

    **Returns:**

    A callable pytree behaving as `fn` under `jit`, `grad` (forward and reverse
    mode) and `vmap`.
    """
    arrays, static = partition(fn, is_array)
    return _NoInline(arrays, static, abstract_fn)
