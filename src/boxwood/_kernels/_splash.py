"""Splash attention: JAX's Pallas TPU kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`), which computes attention
block by block without forming the `(q_seq, kv_seq)` weights, for causal, full
and sliding-window masks, segment ids and grouped-query heads.

Heads come as `(batch, seq, heads, size)`, as `jax.nn.dot_product_attention`
takes them. Block sizes are chosen per sequence length: 1024 from 2048 tokens on
where it divides the length, else 512 where it does, else the largest multiple
of 128 that does. A length that is not a
multiple of 128 is padded up to one, the padding in a segment of its own. Under a
mesh (`jax.set_mesh` / `jax.sharding.use_mesh`, or explicitly sharded inputs) the
kernel runs inside `jax.shard_map`, the batch and the heads split over the mesh's
axes. Off a TPU the kernel runs in Pallas's interpret mode (slow: for tests).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, PartitionSpec
from jaxtyping import Array

LANES = 128  # block sizes and sequence lengths are multiples of this
LARGEST_BLOCK = 512
# From `LONG` tokens on, blocks of `LONG_BLOCK` where they divide the length: on
# a TPU v5e, causal bfloat16 attention forward and backward (fused) at 2048
# tokens took 6.28 ms in 1024 blocks against 6.75 ms in 512 ones (Llama 852M's
# 4 x 32 heads), while at 1024 tokens 512 blocks were the faster (3.42 against
# 3.49 ms, GPT-2 small's 16 x 12): benchmarks/results/2026-12-05-tpu-splash-kernel.md.
LONG, LONG_BLOCK = 2048, 1024
SPLASH_DTYPES = frozenset(jnp.dtype(d) for d in (jnp.bfloat16, jnp.float32))
# The mesh axis that splits the heads when the inputs' sharding is not known
# (`Auto` axes): the one `boxwood.tensor_parallel` splits layers over.
HEADS_AXIS = "model"
# The segment of the padding that brings a length to a multiple of `LANES`: no
# real token's segment.
_PAD_SEGMENT = int(np.iinfo(np.int32).min)

Window = tuple[int, int] | None


@functools.cache
def _sa() -> Any:
    """JAX's splash attention module, imported on first use: Pallas's TPU
    modules took about 0.2 s of CPU to import (docs/performance.md), which a process that never runs
    splash (most of them) should not pay at `import boxwood`."""
    from jax.experimental.pallas.ops.tpu import splash_attention

    return splash_attention


def block_size(length: int) -> int:
    """The block for a sequence of `length` (a multiple of `LANES`): 1024 where the
    length is at least 2048 and 1024 divides it, else 512 where it divides it,
    else the largest multiple of 128 that does."""
    if length >= LONG and length % LONG_BLOCK == 0:
        return LONG_BLOCK
    return next(b for b in range(LARGEST_BLOCK, 0, -LANES) if length % b == 0)


def padded_length(length: int) -> int:
    """`length` rounded up to a multiple of `LANES`."""
    return -(-length // LANES) * LANES


def refusal(q: Any, k: Any, v: Any, *, pad: bool) -> str | None:
    """Why splash attention cannot compute these `(batch, seq, heads, size)`
    heads (`None`: it can). `pad`: whether sequence lengths that are not
    multiples of 128 are padded (else they refuse)."""
    dtypes = {jnp.dtype(a.dtype) for a in (q, k, v)}
    if len(dtypes) != 1 or not dtypes <= SPLASH_DTYPES:
        return (
            f"it takes float32 or bfloat16 heads of one dtype, got "
            f"{sorted(d.name for d in dtypes)}"
        )
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        return (
            "it takes (batch, seq, heads, size) heads with keys and values of one "
            f"shape, got {q.shape}, {k.shape}, {v.shape}"
        )
    size, heads, kv_heads = q.shape[-1], q.shape[2], k.shape[2]
    if k.shape[-1] != size or size % 8:
        return (
            "it takes query and key heads of one size, a multiple of 8, got "
            f"{size} and {k.shape[-1]}"
        )
    if heads % kv_heads:
        return f"{heads} query heads are not a multiple of {kv_heads} key heads"
    if not pad and (q.shape[1] % LANES or k.shape[1] % LANES):
        return (
            f"sequence lengths {q.shape[1]} (queries) and {k.shape[1]} (keys) are "
            f"not both multiples of {LANES}"
        )
    return None


def splash_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    is_causal: bool,
    local_window_size: Window,
    segment_ids: tuple[Array, Array] | None,
    interpret: bool,
) -> Array:
    """Attention of `(batch, seq, heads, size)` heads by the splash kernel,
    scaled by `1 / sqrt(size)` as `jax.nn.dot_product_attention`; `segment_ids`
    are `(batch, q_seq)` and `(batch, kv_seq)` ints (a query attends only to keys
    of its segment). The caller has checked `refusal(q, k, v, pad=True)`."""
    config = (is_causal, local_window_size, interpret)
    ids = () if segment_ids is None else tuple(segment_ids)
    if current_mesh(q) is None:
        return _unsharded(config, len(ids))(q, k, v, *ids)
    return _attention(config)(q, k, v, *ids)


Config = tuple[bool, Window, bool]  # is_causal, local_window_size, interpret


@functools.cache
def _attention(config: Config) -> Callable[..., Array]:
    """The differentiable attention under a mesh for `config`, taking `(q, k, v)`
    and, if given, the `(q_ids, kv_ids)` segment ids.

    The batch is whatever leading axis the arrays have, and every `jax.vmap`
    around the call is folded into it (`custom_vmap`), so that `jax.shard_map`
    splits the whole batch over the devices (a model called per example under
    `jax.vmap` included). The forward and backward passes are each one such call
    (a `custom_vmap` function cannot be transposed): the backward pass runs the
    kernel's own (its forward again, then its gradient kernel), so the residuals
    are only the inputs.
    """
    forward = _folded(lambda *args: _sharded(_local_forward, config, args))
    backward = _folded(lambda *args: _sharded(_local_backward, config, args))

    @jax.custom_vjp
    def attention(*args: Array) -> Array:
        return forward(*args)

    def attention_fwd(*args: Array) -> tuple[Array, tuple[Array, ...]]:
        return forward(*args), args

    def attention_bwd(args: tuple[Array, ...], grad: Array) -> tuple:
        dq, dk, dv = backward(*args, grad)
        return (dq, dk, dv) + (None,) * (len(args) - 3)

    attention.defvjp(attention_fwd, attention_bwd)
    return attention


@functools.cache
def _unsharded(config: Config, n_ids: int) -> Callable[..., Array]:
    """The differentiable attention without a mesh, taking `(q, k, v)` and
    `n_ids` segment-id arrays: the kernel's own forward and backward passes (its
    residuals saved, nothing recomputed), each traced at `_kernel_precision`."""

    @jax.custom_vjp
    def attention(q: Array, k: Array, v: Array, *ids: Array) -> Array:
        call = _kernel_call(config, q, k, ids)
        with _kernel_precision(q.dtype):
            return call(q, k, v)

    def attention_fwd(q: Array, k: Array, v: Array, *ids: Array) -> tuple:
        call = _kernel_call(config, q, k, ids)
        with _kernel_precision(q.dtype):
            return jax.vjp(call, q, k, v)

    def attention_bwd(pullback: Any, grad: Array) -> tuple:
        with _kernel_precision(grad.dtype):  # the output's dtype: the heads'
            return tuple(pullback(grad)) + (None,) * n_ids

    attention.defvjp(attention_fwd, attention_bwd)
    return attention


def _folded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` of arrays with a leading batch axis, under which a `jax.vmap` folds
    its axis into that batch axis (the unbatched arrays broadcast)."""
    folded = jax.custom_batching.custom_vmap(fn)

    @folded.def_vmap
    def _rule(axis_size: int, in_batched: list, *args: Array) -> tuple:
        wide = [
            a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, batched in zip(args, in_batched, strict=True)
        ]
        out = folded(*(a.reshape(-1, *a.shape[2:]) for a in wide))
        unfold = lambda o: o.reshape(axis_size, -1, *o.shape[1:])
        return jax.tree.map(unfold, out), jax.tree.map(lambda _: True, out)

    return folded


def _local_forward(config: Config, q: Array, k: Array, v: Array, *ids: Array) -> Array:
    kernel = _kernel_call(config, q, k, ids)
    with _kernel_precision(q.dtype):
        return kernel(q, k, v)


def _local_backward(
    config: Config, q: Array, k: Array, v: Array, *rest: Array
) -> tuple[Array, Array, Array]:
    *ids, grad = rest
    kernel = _kernel_call(config, q, k, tuple(ids))
    with _kernel_precision(q.dtype):
        _, pullback = jax.vjp(kernel, q, k, v)
        return pullback(grad)


def _kernel_precision(dtype: Any) -> contextlib.AbstractContextManager:
    """The matrix-product precision the kernel is traced at. Its products of
    bfloat16 heads take the default: Mosaic has no float32-contract product of
    bfloat16 operands, so a `jax_default_matmul_precision` of `"highest"` (set
    for float32 numerics elsewhere in a program) would otherwise stop the kernel
    compiling. Float32 heads keep the precision the program set.

    The kernel is built (`_kernel_call`) before this block is entered: building
    it stages its mask arrays onto the device by small programs that JAX keys
    on the trace context, so built here it compiled two programs more than the
    same kernel built in the caller's context."""
    if jnp.dtype(dtype) == jnp.float32:
        return contextlib.nullcontext()
    return jax.default_matmul_precision("default")


def _kernel_call(
    config: Config, q: Array, k: Array, ids: tuple[Array, ...]
) -> Callable[[Array, Array, Array], Array]:
    """`(q, k, v) -> attention` on one device's `(batch, seq, heads, size)`
    heads: padded to multiples of `LANES`, laid out `(heads, seq, size)` per
    example for the kernel, and back."""
    is_causal, window, interpret = config
    q_seq, heads, size = q.shape[1:]
    kv_seq, kv_heads = k.shape[1:3]
    q_len, kv_len = padded_length(q_seq), padded_length(kv_seq)
    segments = _padded_segments(ids, q.shape[0], q_seq, kv_seq, q_len, kv_len)
    kernel = _kernel(is_causal, window, heads, q_len, kv_len, kv_heads == 1, interpret)

    def per_example(q: Array, k: Array, v: Array, *ids: Array) -> Array:
        k, v = (k[0], v[0]) if kv_heads == 1 else (k, v)  # one key head: MQA
        return kernel(q, k, v, segment_ids=_sa().SegmentIds(*ids) if ids else None)

    def call(q: Array, k: Array, v: Array) -> Array:
        q = q * jnp.asarray(1 / math.sqrt(size), q.dtype)
        q = _heads_first(q, q_len)
        k, v = (_heads_first(x, kv_len) for x in (k, v))
        out = jax.vmap(per_example)(q, k, v, *segments)
        return jnp.swapaxes(out, 1, 2)[:, :q_seq]

    return call


def _heads_first(x: Array, length: int) -> Array:
    """`(batch, seq, heads, size)` as `(batch, heads, length, size)`, zero-padded
    along the sequence."""
    x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))
    return jnp.swapaxes(x, 1, 2)


def _padded_segments(
    ids: tuple[Array, ...], batch: int, q_seq: int, kv_seq: int, q_len: int, kv_len: int
) -> tuple[Array, ...]:
    """The `(q_ids, kv_ids)` the kernel takes, padded to `(q_len, kv_len)` with
    `_PAD_SEGMENT` (no segment ids and no padding: none)."""
    if not ids and (q_len, kv_len) == (q_seq, kv_seq):
        return ()
    if not ids:
        ids = (
            jnp.zeros((batch, q_seq), jnp.int32),
            jnp.zeros((batch, kv_seq), jnp.int32),
        )
    q_ids, kv_ids = ids
    pad = lambda s, n: jnp.pad(
        s, ((0, 0), (0, n - s.shape[1])), constant_values=_PAD_SEGMENT
    )
    return pad(q_ids, q_len), pad(kv_ids, kv_len)


@functools.cache
def _kernel(
    is_causal: bool,
    window: Window,
    heads: int,
    q_len: int,
    kv_len: int,
    one_key_head: bool,
    interpret: bool,
) -> Any:
    """The splash kernel for one example's `(heads, q_len, kv_len)` attention."""
    sa = _sa()
    shape = (q_len, kv_len)
    if window is not None:
        left, right = window
        right = min(right, 0) if is_causal else right
        mask = sa.LocalMask(shape, (left, right), 0)
    elif is_causal:
        mask = sa.CausalMask(shape)
    else:
        mask = sa.FullMask(shape)
    bq, bkv = block_size(q_len), block_size(kv_len)
    blocks = sa.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv,
        use_fused_bwd_kernel=True,  # dq, dk and dv in one kernel: faster on a v5e
    )
    make = sa.make_splash_mqa if one_key_head else sa.make_splash_mha
    with jax.ensure_compile_time_eval():  # concrete mask arrays, shared by traces
        return make(
            sa.MultiHeadMask([mask] * heads),
            block_sizes=blocks,
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )


def _sharded(local: Callable[..., Any], config: Config, args: tuple[Array, ...]) -> Any:
    """`local(config, *args)` on each device's share of the batch and heads under
    the current mesh: `args` are `(q, k, v)`, then `(q_ids, kv_ids)` if given,
    then the output's gradient if given."""
    q, k = args[0], args[1]
    mesh = current_mesh(q)
    if mesh is None:  # not expected: the mesh was there when the call began
        return local(config, *args)
    batch_axes, head_axes = _split_axes(mesh, q, k)
    heads = PartitionSpec(batch_axes or None, None, head_axes or None, None)
    rows = PartitionSpec(batch_axes or None, None)
    specs = tuple(heads if a.ndim == 4 else rows for a in args)
    out_specs = heads if local is _local_forward else (heads, heads, heads)
    return jax.shard_map(
        functools.partial(local, config),
        mesh=mesh,
        in_specs=specs,
        out_specs=out_specs,
        axis_names=frozenset(_free_axes(mesh)),
        check_vma=False,
    )(*args)


def current_mesh(q: Array) -> Any:
    """The mesh the call runs under: the context mesh (`jax.set_mesh`), else
    the one `q`'s sharding names; `None` if neither has an axis left to split
    (none, or every one already manual inside a `shard_map`)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = getattr(getattr(jax.typeof(q), "sharding", None), "mesh", mesh)
    if mesh.empty or not _free_axes(mesh):
        return None
    return mesh


def _free_axes(mesh: Any) -> list[str]:
    """The axes of `mesh` not already manual (inside a `shard_map`)."""
    return [
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
        if kind != AxisType.Manual
    ]


def _split_axes(
    mesh: Any, q: Array, k: Array
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The mesh axes splitting the batch and the heads: those of `q`'s sharding
    where it names them (`Explicit` axes), else each free axis in turn splits the
    heads (`HEADS_AXIS`) or the batch where its size divides it (the others
    replicate the work). The heads split only where the key heads divide too."""
    batch, heads, kv_heads = q.shape[0], q.shape[2], k.shape[2]
    spec = getattr(getattr(jax.typeof(q), "sharding", None), "spec", None)
    free = set(_free_axes(mesh))
    sizes = dict(mesh.shape)
    if spec is not None and any(spec):
        named = lambda entry: tuple(
            a
            for a in ((entry,) if isinstance(entry, str) else entry or ())
            if a in free
        )
        on_heads = named(spec[2])
        if kv_heads % math.prod(sizes[a] for a in on_heads):
            on_heads = ()
        return named(spec[0]), on_heads
    batch_axes: list[str] = []
    head_axes: list[str] = []
    for name in _free_axes(mesh):
        b = math.prod(sizes[a] for a in batch_axes) * sizes[name]
        h = math.prod(sizes[a] for a in head_axes) * sizes[name]
        if name == HEADS_AXIS and heads % h == 0 and kv_heads % h == 0:
            head_axes.append(name)
        elif batch % b == 0:
            batch_axes.append(name)
    return tuple(batch_axes), tuple(head_axes)
