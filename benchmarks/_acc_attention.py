"""The attention kernel every hand-written contender of `benchmarks/accelerator.py`
calls (pure JAX, Flax NNX, Equinox), so that they run the same kernel as boxwood:

- `"xla"`: `jax.nn.dot_product_attention(..., is_causal=True, implementation="xla")`;
- `"splash"`: Pallas splash attention (`jax.experimental.pallas.ops.tpu.
  splash_attention`), causal, 512-square blocks (1024 from 2048 tokens on, as boxwood chooses; the sequence length where it is
  shorter, a multiple of 128) with the fused backward kernel, multi-head for GPT-2 and multi-query per key/value head for grouped
  queries. Off a TPU it runs in Pallas' interpret mode (slow: for checking only).

Heads are `(batch, seq, heads, head_dim)`; keys and values may have fewer heads
(grouped-query attention), as `jax.nn.dot_product_attention` takes them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

KINDS = ("xla", "splash")
SPLASH_BLOCK = 512


def attention(q: jax.Array, k: jax.Array, v: jax.Array, kind: str) -> jax.Array:
    """Causal attention of `(batch, seq, heads, dim)` heads with kernel `kind`."""
    if kind == "xla":
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="xla"
        )
    if kind == "splash":
        return _splash(q, k, v)
    raise ValueError(f"attention kind must be one of {KINDS}, got {kind!r}")


def _block(seq: int) -> int:
    # as boxwood chooses: 1024 from 2048 tokens on, else 512 (or the length)
    if seq >= 2048 and seq % 1024 == 0:
        return 1024
    return min(SPLASH_BLOCK, seq)


@functools.cache
def _kernel(heads: int, seq: int, mqa: bool, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b = _block(seq)
    # the fused backward kernel (dq, dk and dv in one), as boxwood's own choice
    sizes = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                          block_kv_dkv=b, block_kv_dkv_compute=b,
                          use_fused_bwd_kernel=True)  # fmt: skip
    mask = sa.MultiHeadMask([sa.CausalMask((seq, seq)) for _ in range(heads)])
    make = sa.make_splash_mqa_single_device if mqa else sa.make_splash_mha_single_device
    # concrete mask arrays, whatever trace asks first: the kernel is cached
    with jax.ensure_compile_time_eval():
        return make(mask=mask, block_sizes=sizes, interpret=interpret)


def _splash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    batch, seq, heads, dim = q.shape
    kv_heads = k.shape[2]
    if seq % _block(seq) or seq % 128:
        raise ValueError(
            f"splash attention: the sequence length {seq} must be a multiple of "
            f"{SPLASH_BLOCK}, or of 128 below it (the kernel's lane width)"
        )
    interpret = jax.default_backend() != "tpu"
    # splash does not scale the logits: the queries are scaled first
    q = (q * (1.0 / math.sqrt(dim))).astype(q.dtype).transpose(0, 2, 1, 3)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # (batch, heads, seq, dim)
    if kv_heads == heads:
        out = jax.vmap(_kernel(heads, seq, False, interpret))(q, k, v)
    else:
        group = heads // kv_heads
        kernel = _kernel(group, seq, True, interpret)
        q = q.reshape(batch, kv_heads, group, seq, dim)
        out = jax.vmap(jax.vmap(kernel))(q, k, v).reshape(batch, heads, seq, dim)
    return out.transpose(0, 2, 1, 3)


def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention written out in float32 (for checking the kernels)."""
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    seq = q.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    logits = jnp.where(causal, logits / math.sqrt(q.shape[-1]), -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v.astype(jnp.float32)).astype(q.dtype)
