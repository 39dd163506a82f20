"""Pieces the architectures share: input checks, activations, causal attention over
a key/value cache held in a `boxwood.nn.State`, rotary embeddings at positions."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, Int

from .._errors import error_if
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


def check_input_ids(
    model: str, input_ids: Any, max_length: int | None, vocab_size: int | None = None
) -> Any:
    """`input_ids` must be a 1-D integer array no longer than the position table,
    of ids in `[0, vocab_size)`. Returns `input_ids`: under a trace the id check
    is attached to the returned array (`boxwood.error_if`), so use it."""
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
    if vocab_size is None:
        return input_ids
    return _ids_in_vocabulary(model, input_ids, vocab_size)


def _ids_in_vocabulary(model: str, input_ids: Any, vocab_size: int) -> Any:
    """Without this check an id past the table would read its last row (JAX clamps
    gathers) and a negative one would wrap around."""
    rule = (
        f"{model}: `input_ids` must hold token ids from 0 to {vocab_size - 1} (the "
        f"vocabulary has {vocab_size} tokens, `vocab_size` in the config)"
    )
    if isinstance(input_ids, jax.core.Tracer):
        outside = (input_ids < 0) | (input_ids >= vocab_size)
        return error_if(input_ids, outside, f"{rule}; got an id outside that range.")
    ids = np.asarray(input_ids)
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if outside.size:
        i = int(outside[0])
        raise ValueError(
            f"{rule}; got {int(ids[i])} at position {i} ({outside.size} out of range "
            "in all)."
        )
    return input_ids


def rope_at(x: Array, positions: Array, frequencies: Any) -> Array:
    """`x`'s heads `(seq, heads, dim)` rotated for the given `(seq,)` positions
    ("rotate half" convention, as [`boxwood.nn.RotaryPositionalEmbedding`][] and
    Hugging Face's Llama), channel pair `i` at angle `position * frequencies[i]`
    (`(dim // 2,)`, from `_rope_scaling.inverse_frequencies`)."""
    freqs = jnp.asarray(frequencies, jnp.float32)
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
    window: int | None = None,
) -> Float[Array, "q_seq heads dim"]:
    """Attention of each query to the keys at positions up to its own (and, with a
    sliding `window`, after `position - window`: the last `window` positions).

    Key `j` holds position `j`; with grouped-query attention each key/value head
    serves `heads // kv_heads` consecutive query heads. Softmax in float32.
    """
    seq, heads, dim = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(seq, kv_heads, heads // kv_heads, dim).astype(jnp.float32)
    logits = jnp.einsum("qhgd,khd->hgqk", q, k.astype(jnp.float32)) / math.sqrt(dim)
    distance = q_positions[:, None] - jnp.arange(k.shape[0])[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
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
    window: int | None = None,
) -> tuple[Array, State | None]:
    """Causal attention for new tokens at positions `start, start+1, ...`.

    Without a `state`, the keys are the new tokens' own (and `start` must be 0).
    With one, the new keys and values are written into the cache at `start` first,
    and the queries attend over the whole cache (later slots are masked, and with
    a sliding `window` the slots at or before `position - window` too).
    """
    positions = start + jnp.arange(q.shape[0])
    if state is None:
        return causal_attention(q, k, v, positions, window), None
    cache_k, cache_v = state.get(index)
    cache_k = jax.lax.dynamic_update_slice_in_dim(
        cache_k, k.astype(cache_k.dtype), start, 0
    )
    cache_v = jax.lax.dynamic_update_slice_in_dim(
        cache_v, v.astype(cache_v.dtype), start, 0
    )
    out = causal_attention(q, cache_k, cache_v, positions, window)
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
