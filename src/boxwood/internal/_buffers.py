"""Loop buffers: `buffer.at[i].set(x, pred=...)` inside `while_loop`/`scan` bodies,
`buffer_at_set`, `MaybeBuffer`, and the primitives `maybe_set_p` and
`select_if_vmap_p`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._filters import combine, is_array, partition
from .._module import Module, field
from ._primitive import (
    filter_primitive_batching,
    filter_primitive_bind,
    filter_primitive_def,
    filter_primitive_jvp,
    filter_primitive_transpose,
)


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
    out = filter_primitive_bind(maybe_set_p, pred, xs, x, index)
    if t_xs is None and t_x is None:
        return out, None
    t_xs = jnp.zeros_like(xs) if t_xs is None else t_xs
    t_x = jnp.zeros_like(x) if t_x is None else t_x
    return out, filter_primitive_bind(maybe_set_p, pred, t_xs, t_x, index)


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
maybe_set_p.multiple_results = True
maybe_set_p.def_impl(filter_primitive_def(_maybe_set_impl))
maybe_set_p.def_abstract_eval(filter_primitive_def(_maybe_set_abstract))
ad.primitive_jvps[maybe_set_p] = filter_primitive_jvp(_maybe_set_jvp)
ad.primitive_transposes[maybe_set_p] = filter_primitive_transpose(_maybe_set_transpose)
batching.primitive_batchers[maybe_set_p] = filter_primitive_batching(_maybe_set_batch)
mlir.register_lowering(
    maybe_set_p,
    mlir.lower_fun(filter_primitive_def(_maybe_set_impl), multiple_results=True),
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


select_if_vmap_p = Primitive("boxwood_select_if_vmap")
select_if_vmap_p.def_impl(_select)
select_if_vmap_p.def_abstract_eval(lambda pred, x, y: x)
ad.primitive_jvps[select_if_vmap_p] = _select_jvp
ad.primitive_transposes[select_if_vmap_p] = _select_transpose
batching.primitive_batchers[select_if_vmap_p] = _select_batch
mlir.register_lowering(
    select_if_vmap_p, mlir.lower_fun(_select, multiple_results=False)
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
    x = jnp.broadcast_to(
        jnp.asarray(x, xs.dtype), jax.eval_shape(lambda: xs[index]).shape
    )
    return filter_primitive_bind(maybe_set_p, pred, xs, x, _from_slices(index))


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

    @property
    def at(self) -> _BufferAt:
        return _BufferAt(self)

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def dtype(self) -> Any:
        return self.array.dtype

    @property
    def size(self) -> int:
        return self.array.size

    @property
    def ndim(self) -> int:
        return self.array.ndim


class _BufferAt:
    def __init__(self, buffer: _Buffer) -> None:
        self._buffer = buffer

    def __getitem__(self, item: Any) -> _BufferIndex:
        return _BufferIndex(self._buffer, item)


class _BufferIndex:
    def __init__(self, buffer: _Buffer, item: Any) -> None:
        self._buffer, self._item = buffer, item

    def get(self, **kwargs: Any) -> Any:
        return self._buffer.array.at[self._item].get(**kwargs)

    def set(self, x: Any, *, pred: Any = True, **kwargs: Any) -> _Buffer:
        array, tag, live = self._buffer.array, self._buffer.tag, self._buffer.live
        if live is not None:
            pred = jnp.logical_and(pred, live)
        if isinstance(array, _Buffer):  # nested loops: write through
            return _Buffer(array.at[self._item].set(x, pred=pred, **kwargs), tag, live)
        if kwargs:
            new = array.at[self._item].set(x, **kwargs)
            return _Buffer(jnp.where(pred, new, array), tag, live)
        return _Buffer(_maybe_set(pred, array, x, self._item), tag, live)


def buffer_at_set(buffer: Any, item: Any, x: Any, *, pred: Any = True, **kwargs: Any):
    """`buffer.at[item].set(x)` where `pred` is true (else `buffer` unchanged), for a
    loop buffer or a plain array (say, a body function called outside the loop)."""
    if isinstance(buffer, _Buffer):
        return buffer.at[item].set(x, pred=pred, **kwargs)
    if pred is not True:
        x = jnp.where(pred, x, buffer.at[item].get(**kwargs))
    return buffer.at[item].set(x, **kwargs)


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
