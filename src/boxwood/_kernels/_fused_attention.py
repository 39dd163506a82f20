"""Fused attention, shared by `boxwood.nn`'s attention functions and layers and by
`boxwood.models`: which heads it serves, and which implementation computes them
(splash attention on a TPU, cuDNN's flash attention on a GPU, where they apply;
XLA's `jax.nn.dot_product_attention` otherwise)."""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array

from . import _splash

# dtypes `jax.nn.dot_product_attention` computes at full precision
_FUSED_DTYPES = frozenset(
    jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32)
)
Implementation = Literal["xla", "cudnn", "splash"] | None


def fusable(q: Array, k: Array, v: Array) -> bool:
    """Whether `jax.nn.dot_product_attention` serves these heads as well as the
    explicit softmax: one dtype among float16, bfloat16 and float32 (it takes the
    softmax in float32, which would round float64 inputs), and value heads as wide
    as the key heads (which it requires)."""
    dtypes = {jnp.dtype(a.dtype) for a in (q, k, v)}
    served = _FUSED_DTYPES
    if jax.default_backend() != "gpu":
        # Its float16 products ask for float32 sums, which XLA refuses on the
        # CPU ("F16_F16_F32 is not supported") and on a TPU v5e ("Dot algorithm
        # ALG_DOT_F16_F16_F32 is not supported", even at the default precision);
        # a GPU computes them
        served = served - {jnp.dtype(jnp.float16)}
    return len(dtypes) == 1 and dtypes <= served and k.shape == v.shape


# What cuDNN's flash attention takes: half-precision heads whose size is a
# multiple of 8, at most 128.
_CUDNN_DTYPES = frozenset(jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16))
# What `jax.nn.dot_product_attention(implementation="cudnn")` raises while
# tracing where this GPU, cuDNN or shape cannot take the kernel.
_CUDNN_REFUSALS = (NotImplementedError, RuntimeError, TypeError, ValueError)


def _cudnn_suits(q: Array, k: Array, v: Array) -> bool:
    size = q.shape[-1]
    return (
        jax.default_backend() == "gpu"
        and {jnp.dtype(a.dtype) for a in (q, k, v)} <= _CUDNN_DTYPES
        and size % 8 == 0
        and size <= 128
        and k.shape[-1] == v.shape[-1] == size
    )


# What the splash kernel raises while tracing where it cannot take these heads
# after all (the chooser falls back to XLA's attention then).
_SPLASH_REFUSALS = (NotImplementedError, ValueError)


def _splash_suits(q: Array, k: Array, v: Array) -> bool:
    """Whether `implementation=None` picks splash attention: on a TPU, for heads
    the kernel takes whose lengths are multiples of 128 (no padding), on one
    device or under a mesh it can split them over (`jax.set_mesh`)."""
    return (
        jax.default_backend() == "tpu"
        and _splash.refusal(q, k, v, pad=False) is None
        and (jax.device_count() == 1 or _splash.current_mesh(q) is not None)
    )


def _segment_mask(segment_ids: tuple[Array, Array]) -> Array:
    """`(batch, 1, q_seq, kv_seq)`: whether each query shares its key's segment."""
    q_ids, kv_ids = segment_ids
    return (q_ids[:, :, None] == kv_ids[:, None, :])[:, None]


def _check_segment_ids(segment_ids: Any, q: Array, k: Array) -> tuple[Array, Array]:
    want = ((q.shape[0], q.shape[1]), (k.shape[0], k.shape[1]))
    ok = isinstance(segment_ids, tuple | list) and len(segment_ids) == 2
    if ok:
        segment_ids = tuple(jnp.asarray(s) for s in segment_ids)
        ok = tuple(s.shape for s in segment_ids) == want and all(
            jnp.issubdtype(s.dtype, jnp.integer) for s in segment_ids
        )
    if not ok:
        raise ValueError(
            "fused_attention: `segment_ids` must be a pair of integer arrays of "
            f"shapes (batch, q_seq) = {want[0]} and (batch, kv_seq) = {want[1]}, "
            f"got {jax.tree.map(jnp.shape, segment_ids)}."
        )
    q_ids, kv_ids = segment_ids
    return q_ids.astype(jnp.int32), kv_ids.astype(jnp.int32)


def _check_splash(q: Array, k: Array, v: Array) -> None:
    """Splash attention is asked for by name: its refusals are errors."""
    why = _splash.refusal(q, k, v, pad=True)
    if why is not None:
        raise ValueError(
            f"Attention implementation 'splash' cannot take heads of shapes "
            f"{q.shape}, {k.shape}, {v.shape} (batch, seq, heads, size) and dtypes "
            f"{q.dtype}, {k.dtype}, {v.dtype}: {why}. Use implementation None "
            "or 'xla' for these."
        )


def fused_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    segment_ids: tuple[Array, Array] | None = None,
    implementation: Implementation = None,
) -> Array:
    """Attention of `(batch, seq, heads, size)` heads, as
    `jax.nn.dot_product_attention` computes it (scaled by `1 / sqrt(size)`).

    `segment_ids`: `(batch, q_seq)` and `(batch, kv_seq)` integer arrays; a query
    attends only to the keys of its own segment (on top of `mask`, `is_causal`
    and `local_window_size`). Padding is a segment of its own.

    With `implementation=None` and no explicit `mask`: on a TPU, heads the splash
    kernel takes (float32 or bfloat16, a head size that is a multiple of 8,
    sequence lengths that are multiples of 128; on several devices only under a
    mesh, `jax.set_mesh`) use it; on a GPU, heads that cuDNN's flash attention
    takes (float16 or bfloat16, a head size that is a multiple of 8 up to 128)
    use it. Where either refuses while tracing, and everywhere else, XLA's
    attention computes the result. `"xla"` or `"cudnn"` is passed on to
    `jax.nn.dot_product_attention` as asked. `"splash"` runs the splash kernel
    for every call without an explicit `mask`, padding other lengths to multiples
    of 128 (a `ValueError` for heads it cannot take); off a TPU it runs in
    Pallas's interpret mode, which is slow and meant for tests and debugging. A
    call with an explicit `mask`, which the kernel cannot take (a decoding step
    over a cache, per-layer windows held as data), uses XLA's attention.
    """
    if isinstance(local_window_size, int):
        local_window_size = (local_window_size, local_window_size)
    if segment_ids is not None:
        segment_ids = _check_segment_ids(segment_ids, q, k)
    splash = functools.partial(
        _splash.splash_attention,
        is_causal=is_causal,
        local_window_size=local_window_size,
        segment_ids=segment_ids,
    )
    if implementation == "splash" and mask is None:
        _check_splash(q, k, v)
        return splash(q, k, v, interpret=jax.default_backend() != "tpu")
    if implementation is None and mask is None and _splash_suits(q, k, v):
        try:
            return splash(q, k, v, interpret=False)
        except _SPLASH_REFUSALS:
            pass
    if segment_ids is not None:
        same = _segment_mask(segment_ids)
        mask = same if mask is None else jnp.logical_and(mask, same)

    def call(chosen: Literal["xla", "cudnn"] | None) -> Array:
        # one input dtype: JAX's own float32 logits are the only promotion
        with jax.numpy_dtype_promotion("standard"):
            return jax.nn.dot_product_attention(
                q,
                k,
                v,
                mask=mask,
                is_causal=is_causal,
                local_window_size=local_window_size,
                implementation=chosen,
            )

    if implementation is None and mask is None and _cudnn_suits(q, k, v):
        try:
            return call("cudnn")
        except _CUDNN_REFUSALS:
            pass
    return call("xla" if implementation == "splash" else implementation)
