"""Attention through `jax.nn.dot_product_attention`, shared by `boxwood.nn`'s
attention functions and layers and by `boxwood.models`: which heads it serves,
and which implementation to ask for (cuDNN's flash attention on a GPU where it
applies, XLA's otherwise)."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array

# dtypes `jax.nn.dot_product_attention` computes at full precision
_FUSED_DTYPES = frozenset(
    jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32)
)
Implementation = Literal["xla", "cudnn"] | None


def fusable(q: Array, k: Array, v: Array) -> bool:
    """Whether `jax.nn.dot_product_attention` serves these heads as well as the
    explicit softmax: one dtype among float16, bfloat16 and float32 (it takes the
    softmax in float32, which would round float64 inputs), and value heads as wide
    as the key heads (which it requires)."""
    dtypes = {jnp.dtype(a.dtype) for a in (q, k, v)}
    return len(dtypes) == 1 and dtypes <= _FUSED_DTYPES and k.shape == v.shape


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


def fused_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    local_window_size: tuple[int, int] | None = None,
    implementation: Implementation = None,
) -> Array:
    """`jax.nn.dot_product_attention` of `(batch, seq, heads, size)` heads.

    With `implementation=None` and no explicit `mask`, heads that cuDNN's flash
    attention takes (float16 or bfloat16, a head size that is a multiple of 8 up
    to 128) on a GPU use it; where JAX refuses it while tracing (this cuDNN or GPU
    lacks it) the call falls back to XLA's attention, as it does everywhere else.
    `"xla"` or `"cudnn"` is passed on as asked.
    """

    def call(chosen: Implementation) -> Array:
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
    return call(implementation)
