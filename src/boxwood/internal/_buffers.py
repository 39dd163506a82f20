"""Loop buffers: `buffer.at[i].set(x, pred=...)` inside `while_loop`/`scan` bodies,
`buffer_at_set`, `MaybeBuffer`, and the primitives `maybe_set_p` and
`select_if_vmap_p`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._filters import combine, is_array, partition
from .._module import Module, field
from . import _primitive as fprim


def _register(prim: Primitive, impl: Any, abstract: Any, rules: dict) -> Primitive:
    """Give `prim` its implementation (also its lowering), abstract evaluation, and
    `rules`: `{"jvp": ..., "transpose": ..., "batch": ...}`."""
    prim.def_impl(impl)
    prim.def_abstract_eval(abstract)
    tables = {
        "jvp": ad.primitive_jvps,
        "transpose": ad.primitive_transposes,
        "batch": batching.primitive_batchers,
    }
    for kind, rule in rules.items():
        tables[kind][prim] = rule
    lowered = mlir.lower_fun(impl, multiple_results=prim.multiple_results)
    mlir.register_lowering(prim, lowered)
    return prim


class _Slice(Module):
    """A slice as a hashable value (slices are not hashable before Python 3.12)."""

    start: Any = field(static=True)
    stop: Any = field(static=True)
    step: Any = field(static=True)


def _to_slices(index: Any) -> Any:
    def fix(x: Any) -> Any:
        return slice(x.start, x.stop, x.step) if isinstance(x, _Slice) else x

    return jax.tree_util.tree_map(fix, index, is_leaf=lambda x: isinstance(x, _Slice))


def _from_slices(index: Any) -> Any:
    def fix(x: Any) -> Any:
        return _Slice(x.start, x.stop, x.step) if isinstance(x, slice) else x

    return jax.tree_util.tree_map(fix, index)


def _set(pred: Any, xs: Any, x: Any, index: Any) -> Any:
    # Select on the written part only, so that XLA updates `xs` in place: the cost
    # is that of the part, not of the whole buffer.
    index = _to_slices(index)
    return xs.at[index].set(jnp.where(pred, x, xs[index]))


def _maybe_set_impl(pred, xs, x, index):
    return _set(pred, xs, x, index)


def _maybe_set_abstract(pred, xs, x, index):
    return xs


def _maybe_set_jvp(primals, tangents):
    pred, xs, x, index = primals
    _, t_xs, t_x, _ = tangents
    out = fprim.filter_primitive_bind(maybe_set_p, pred, xs, x, index)
    if t_xs is None and t_x is None:
        return out, None
    t_xs = jnp.zeros_like(xs) if t_xs is None else t_xs
    t_x = jnp.zeros_like(x) if t_x is None else t_x
    return out, fprim.filter_primitive_bind(maybe_set_p, pred, t_xs, t_x, index)


def _maybe_set_transpose(inputs, ct):
    pred, xs, x, index = inputs
    if ct is None:
        return None, None, None, None
    ix = _to_slices(index)
    ct_xs = ct.at[ix].set(jnp.where(pred, 0, ct[ix]))
    ct_x = jnp.where(pred, ct[ix], 0) if isinstance(x, ad.UndefinedPrimal) else None
    ct_xs = ct_xs if isinstance(xs, ad.UndefinedPrimal) else None
    return None, ct_xs, ct_x, None


def _is_none(x: Any) -> bool:
    return x is None


def _maybe_set_batch(inputs, axes):
    pred, xs, x, index = inputs
    values = [pred, xs, x, *jax.tree_util.tree_leaves(index)]
    value_axes = [*axes[:3], *jax.tree_util.tree_leaves(axes[3], is_leaf=_is_none)]
    size = next(jnp.shape(v)[a] for v, a in zip(values, value_axes) if a is not None)

    def front(v: Any, a: Any) -> Any:
        v = jnp.asarray(v)
        return (
            jnp.broadcast_to(v, (size, *v.shape))
            if a is None
            else jnp.moveaxis(v, a, 0)
        )

    pred_, xs_, x_ = (front(v, a) for v, a in zip((pred, xs, x), axes[:3]))
    dyn, static = partition(index, is_array)
    dyn_axes = axes[3]

    def one(p: Any, b: Any, v: Any, d: Any) -> Any:
        return _set(p, b, v, combine(d, static))

    out = jax.vmap(one, in_axes=(0, 0, 0, dyn_axes))(pred_, xs_, x_, dyn)
    return out, 0


maybe_set_p = Primitive("boxwood_maybe_set")
maybe_set_p.multiple_results = True  # the filter_primitive_* convention
_register(
    maybe_set_p,
    fprim.filter_primitive_def(_maybe_set_impl),
    fprim.filter_primitive_def(_maybe_set_abstract),
    {
        "jvp": fprim.filter_primitive_jvp(_maybe_set_jvp),
        "transpose": fprim.filter_primitive_transpose(_maybe_set_transpose),
        "batch": fprim.filter_primitive_batching(_maybe_set_batch),
    },
)


def _select(pred: Any, x: Any, y: Any) -> Any:
    return jax.lax.select(pred, x, y)


def _select_batch(args: tuple, dims: tuple) -> tuple:
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [
        jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
        for a, d in zip(args, dims)
    ]
    pred, x, y = moved
    pred = pred.reshape(pred.shape + (1,) * (x.ndim - pred.ndim))
    return jnp.where(pred, x, y), 0


def _select_jvp(primals: tuple, tangents: tuple) -> tuple:
    pred, x, y = primals
    _, tx, ty = (ad.instantiate_zeros(t) for t in tangents)
    return select_if_vmap_p.bind(pred, x, y), select_if_vmap_p.bind(pred, tx, ty)


def _select_transpose(ct: Any, pred: Any, x: Any, y: Any) -> list:
    ct = ad.instantiate_zeros(ct)
    zeros = jnp.zeros_like(ct)
    ct_x = jnp.where(pred, ct, zeros) if isinstance(x, ad.UndefinedPrimal) else None
    ct_y = jnp.where(pred, zeros, ct) if isinstance(y, ad.UndefinedPrimal) else None
    return [None, ct_x, ct_y]


select_if_vmap_p = _register(
    Primitive("boxwood_select_if_vmap"),
    _select,
    lambda pred, x, y: x,
    {"jvp": _select_jvp, "transpose": _select_transpose, "batch": _select_batch},
)


def _maybe_set(pred: Any, xs: Any, x: Any, index: Any) -> Any:
    pred = jnp.asarray(pred)
    if pred.shape != () or pred.dtype != jnp.bool_:
        raise ValueError(f"`pred` must be a boolean scalar; got {pred!r}.")
    if not jnp.can_cast(jnp.result_type(x), jnp.result_type(xs), "same_kind"):
        raise ValueError(
            f"`buffer.at[...].set(value)`: `value` of dtype {jnp.result_type(x)} "
            f"does not fit a buffer of dtype {jnp.result_type(xs)}."
        )
    x = jnp.broadcast_to(jnp.asarray(x, xs.dtype), _indexed_shape(xs, index))
    return fprim.filter_primitive_bind(maybe_set_p, pred, xs, x, _from_slices(index))


def _indexed_shape(xs: Any, index: Any) -> tuple:
    """The shape of `xs[index]`. A scalar integer index (a loop writing one row
    per step, the usual case) is read off directly; `jax.eval_shape` would trace
    a function per write."""
    if isinstance(index, int) and not isinstance(index, bool) and xs.ndim >= 1:
        return xs.shape[1:]
    if (
        isinstance(index, (jax.Array, np.ndarray, np.integer))
        and jnp.ndim(index) == 0
        and jnp.issubdtype(jnp.result_type(index), jnp.integer)
        and xs.ndim >= 1
    ):
        return xs.shape[1:]
    return jax.eval_shape(lambda: xs[index]).shape


class _Buffer(Module):
    """An array of a loop's carry selected by `buffers=`, as the loop body sees it:
    indexing reads it and `.at[i].set(x, pred=...)` writes it, where `pred` (a
    boolean scalar) may turn the write off. `array` is another `_Buffer` when loops
    are nested and both select it; `tag` says which loop made this one."""

    array: Any
    tag: Any = field(static=True, default=None)
    # Whether the loop's step is live: `False` for a batch element whose loop has
    # ended while others (under `vmap`) run on. Every write is gated by it, so the
    # loop need not select between the old and the new buffer. `None`: always.
    live: Any = None

    def __getitem__(self, item: Any) -> Any:
        return self.array[item]

    def __getattr__(self, name: str) -> Any:
        # `shape`, `dtype`, `size`, `ndim`: those of the array.
        if name in _ARRAY_ATTRIBUTES:
            return getattr(self.array, name)
        raise AttributeError(name)

    @property
    def at(self) -> _Indexer:
        return _Indexer(self, None)

    def _written(self, item: Any, x: Any, pred: Any, kwargs: dict) -> _Buffer:
        """This buffer with `x` written at `item` where `pred` and `live`."""
        if self.live is not None:
            pred = jnp.logical_and(pred, self.live)
        if isinstance(self.array, _Buffer):  # nested loops: write through
            array = self.array._written(item, x, pred, kwargs)
        elif kwargs:  # indexing options: select over the whole array
            array = _select_write(self.array, item, x, pred, kwargs)
        else:  # select over the written part only, in place
            array = _maybe_set(pred, self.array, x, item)
        return _Buffer(array, self.tag, self.live)


_ARRAY_ATTRIBUTES = frozenset({"shape", "dtype", "size", "ndim"})


class _Indexer:
    """`buffer.at` (`index` is `None`) and `buffer.at[index]`."""

    __slots__ = ("buffer", "index")

    def __init__(self, buffer: _Buffer, index: Any) -> None:
        self.buffer, self.index = buffer, index

    def __getitem__(self, index: Any) -> _Indexer:
        return _Indexer(self.buffer, index)

    def get(self, **kwargs: Any) -> Any:
        return self.buffer.array.at[self.index].get(**kwargs)

    def set(self, x: Any, *, pred: Any = True, **kwargs: Any) -> _Buffer:
        return self.buffer._written(self.index, x, pred, kwargs)


def _select_write(array: Any, item: Any, x: Any, pred: Any, kwargs: dict) -> Any:
    """`array.at[item].set(x, **kwargs)` where `pred`, else `array`."""
    written = array.at[item].set(x, **kwargs)
    if pred is True:
        return written
    return jnp.where(pred, written, array)


def buffer_at_set(buffer: Any, item: Any, x: Any, *, pred: Any = True, **kwargs: Any):
    """`buffer.at[item].set(x, pred=pred)` (`buffer` unchanged where `pred` is
    false), for a loop buffer or a plain array alike (say, a loop body also called
    outside the loop)."""
    if isinstance(buffer, _Buffer):
        return buffer._written(item, x, pred, kwargs)
    return _select_write(buffer, item, x, pred, kwargs)


def is_buffer(x: Any) -> bool:
    return isinstance(x, _Buffer)


def wrap_buffers(tree: Any, buffers: Any, tag: Any, live: Any = None) -> Any:
    """`tree` with the arrays selected by `buffers(tree)` wrapped as `_Buffer`s
    tagged `tag` (one loop's), their writes gated by `live`."""
    if buffers is None:
        return tree
    selected = {id(x) for x in jax.tree_util.tree_leaves(buffers(tree))}
    # An enclosing loop's buffers are leaves too: their arrays are wrapped (writes
    # go through both loops), their `live` flags are not.
    outer = jax.tree_util.tree_leaves(tree, is_leaf=is_buffer)
    selected -= {id(b.live) for b in outer if is_buffer(b) and b.live is not None}
    return jax.tree_util.tree_map(
        lambda x: _Buffer(x, tag, live) if id(x) in selected else x, tree
    )


def unwrap_buffers(tree: Any, tag: Any) -> Any:
    """`tree` without the `_Buffer`s tagged `tag` (those of other loops stay)."""

    def unwrap(x: Any) -> Any:
        if not isinstance(x, _Buffer):
            return x
        inner = unwrap(x.array)
        return inner if x.tag is tag else _Buffer(inner, x.tag, x.live)

    return jax.tree_util.tree_map(unwrap, tree, is_leaf=is_buffer)


class _MaybeBufferCheck(type):
    annotation: Any  # set by `MaybeBuffer.__class_getitem__`

    def __instancecheck__(cls, instance: Any) -> bool:
        while isinstance(instance, _Buffer):
            instance = instance.array
        return isinstance(instance, cls.annotation)


class MaybeBuffer:
    """`MaybeBuffer[T]`: a type accepting a `T` or a loop buffer holding one (for
    annotations of loop bodies checked at run time, for example by jaxtyping)."""

    def __class_getitem__(cls, item: Any) -> type:
        return _MaybeBufferCheck("MaybeBuffer", (), {"annotation": item})
