"""Pieces the architectures share: input checks, activations, causal attention over
a key/value cache held in a `boxwood.nn.State`, rotary embeddings at positions."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Float, Int

from ..nn import RotaryPositionalEmbedding, State, StateIndex
from ..nn._state import _make_index

_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}
ACTIVATION_NAMES = tuple(_ACTIVATIONS)


def activation(name: str, x: Array) -> Array:
    """`transformers`' activation `name` (as in `config.json`) applied to `x`."""
    return _ACTIVATIONS[name](x)


def supported_activation(value: Any) -> bool:
    return value in _ACTIVATIONS


def check_input_ids(model: str, input_ids: Any, max_length: int | None) -> None:
    """`input_ids` must be a 1-D integer array no longer than the position table."""
    dtype = jnp.result_type(input_ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(
            f"{model}: `input_ids` must be an integer array of token ids, got dtype "
            f"{dtype}. Convert it with `input_ids.astype(jnp.int32)`."
        )
    if jnp.ndim(input_ids) != 1:
        raise ValueError(
            f"{model}: `input_ids` must have shape (seq,) (one sequence: boxwood "
            f"layers act on one example), got shape {jnp.shape(input_ids)}. For a "
            "batch use `jax.vmap(model)(input_ids)`."
        )
    length = jnp.shape(input_ids)[0]
    if max_length is not None and length > max_length:
        raise ValueError(
            f"{model}: `input_ids` has {length} tokens, more than the model's "
            f"{max_length} positions (`max_position_embeddings`/`n_positions` in its "
            "config)."
        )


def rope_at(
    x: Float[Array, "seq heads dim"], positions: Int[Array, " seq"], theta: float
) -> Float[Array, "seq heads dim"]:
    """`x`'s heads rotated for the given positions ("rotate half" convention, as
    [`boxwood.nn.RotaryPositionalEmbedding`][] and Hugging Face's Llama)."""
    dim = x.shape[-1]
    freqs = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]
    cos = jnp.tile(jnp.cos(angles), (1, 2))[:, None, :]
    sin = jnp.tile(jnp.sin(angles), (1, 2))[:, None, :]
    rotated = RotaryPositionalEmbedding.rotate_half(x).astype(jnp.float32)
    return (x.astype(jnp.float32) * cos + rotated * sin).astype(x.dtype)


def causal_attention(
    q: Float[Array, "q_seq heads dim"],
    k: Float[Array, "kv_seq kv_heads dim"],
    v: Float[Array, "kv_seq kv_heads dim"],
    q_positions: Int[Array, " q_seq"],
) -> Float[Array, "q_seq heads dim"]:
    """Attention of each query to the keys at positions up to its own.

    Key `j` holds position `j`; with grouped-query attention each key/value head
    serves `heads // kv_heads` consecutive query heads. Softmax in float32.
    """
    seq, heads, dim = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(seq, kv_heads, heads // kv_heads, dim).astype(jnp.float32)
    logits = jnp.einsum("qhgd,khd->hgqk", q, k.astype(jnp.float32)) / math.sqrt(dim)
    allowed = jnp.arange(k.shape[0])[None, :] <= q_positions[:, None]
    logits = jnp.where(allowed[None, None], logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("hgqk,khd->qhgd", weights, v.astype(jnp.float32))
    return out.reshape(seq, heads, dim).astype(v.dtype)


def attend_with_cache(
    index: StateIndex,
    state: State | None,
    q: Array,
    k: Array,
    v: Array,
    start: Any,
) -> tuple[Array, State | None]:
    """Causal attention for new tokens at positions `start, start+1, ...`.

    Without a `state`, the keys are the new tokens' own (and `start` must be 0).
    With one, the new keys and values are written into the cache at `start` first,
    and the queries attend over the whole cache (later slots are masked).
    """
    positions = start + jnp.arange(q.shape[0])
    if state is None:
        return causal_attention(q, k, v, positions), None
    cache_k, cache_v = state.get(index)
    cache_k = jax.lax.dynamic_update_slice_in_dim(
        cache_k, k.astype(cache_k.dtype), start, 0
    )
    cache_v = jax.lax.dynamic_update_slice_in_dim(
        cache_v, v.astype(cache_v.dtype), start, 0
    )
    out = causal_attention(q, cache_k, cache_v, positions)
    return out, state.set(index, (cache_k, cache_v))


def empty_cache_index() -> StateIndex:
    """A layer's key into the cache: its value is made by `init_cache`."""
    return StateIndex(None)


def init_cache(model: Any, length: int, shapes: dict[str, Any]) -> State:
    """A `State` with an empty key/value cache of `length` positions for every
    `StateIndex` in `model`; `shapes` gives `(kv_heads, head_dim, dtype)`."""
    kv_heads, head_dim, dtype = shapes["kv_heads"], shapes["head_dim"], shapes["dtype"]
    zeros = jnp.zeros((length, kv_heads, head_dim), dtype)
    indices = [
        _make_index(x.marker, (zeros, zeros))
        for x in jtu.tree_leaves(model, is_leaf=lambda x: isinstance(x, StateIndex))
        if isinstance(x, StateIndex)
    ]
    return State(indices)
