"""Causal self-attention of the architectures: the attention implementation
(`check_implementation`), what one call's layers share (`Step`: cache slot, left
padding, segment ids of an `attention_mask`, dropout key), which keys each query
may see (`_visible`), and `attend`: the fused kernels of `_kernels`
where they apply, the weights formed explicitly otherwise."""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._kernels import fusable, fused_attention

Implementation = Literal["xla", "cudnn", "splash"] | None


IMPLEMENTATIONS = (None, "xla", "cudnn", "splash")


def check_implementation(model: str, implementation: Any) -> None:
    """`implementation` must be one of `_kernels.fused_attention`'s."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"{model}: `attention_implementation` must be None (boxwood's choice), "
            f"'xla', 'cudnn' or 'splash', got {implementation!r}. Set it with "
            "`model.with_attention_implementation(...)`."
        )


class Step(NamedTuple):
    """What every layer of one call shares: the cache slot of the first new token
    (`start`), the number of leading slots that are left padding (`pad`, `None`:
    none), whether the keys come from a cache (`cached`), the attention
    implementation, the call's `extent` (one more than its largest real
    position, which `dynamic` RoPE scaling reads; `None`: from the positions),
    the segment ids of the queries and of the keys (`segments`, `(q_seq,)` and
    `(kv_seq,)` int32: a query attends only keys of its own segment; `None`: one
    segment), the dropout key (`key`, `None` without dropout: layer `i`'s
    is `fold_in(key, i)`), and whether the body returns every layer's hidden
    states (`every_layer`, `transformers`' `output_hidden_states`)."""

    start: Any
    pad: Any = None
    cached: bool = False
    implementation: Implementation = None
    extent: Any = None
    segments: tuple[Array, Array] | None = None
    key: Any = None
    every_layer: bool = False

    def slots(self, seq: int) -> Array:
        """The cache slots of `seq` new tokens."""
        return self.start + jnp.arange(seq)

    def positions(self, seq: int) -> Array:
        """The positions of `seq` new tokens: their slots less the padding (pad
        slots themselves at position 0)."""
        slots = self.slots(seq)
        return slots if self.pad is None else jnp.maximum(slots - self.pad, 0)


def segment_ids(attention_mask: Array) -> tuple[Array, Array]:
    """The query and key segment ids of one sequence's `attention_mask` (1 real,
    0 padding): real tokens attend to real tokens, padding to padding (so that
    every query sees at least itself and its unused output stays finite)."""
    ids = jnp.asarray(attention_mask).astype(jnp.int32)
    return ids, ids


def _same_segment(segments: tuple[Array, Array]) -> Array:
    """`(q_seq, kv_seq)`: whether each query and key share a segment (for the
    explicit weights; the fused call takes the segment ids themselves)."""
    q, kv = segments
    return q[:, None] == kv[None, :]


def _visible(step: Step, q_seq: int, kv_seq: int, window: Any) -> Array:
    """`(q_seq, kv_seq)`: whether each new token may attend to each key slot:
    slots up to its own, after `slot - window` (a sliding `window`), none of
    the left padding, and only keys of its own segment. A pad token attends to
    itself alone, so that its (unused) output stays finite."""
    distance = step.slots(q_seq)[:, None] - jnp.arange(kv_seq)[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    if step.pad is not None:
        real = (jnp.arange(kv_seq) >= step.pad)[None, :]
        allowed = allowed & (real | (distance == 0))
    if step.segments is not None:
        allowed = allowed & _same_segment(step.segments)
    return allowed


def _explicit(
    q: Array, k: Array, v: Array, mask: Array, dropout: Any = None, key: Any = None
) -> Array:
    """Grouped-query attention with the weights formed explicitly, in at least
    float32 (for dtypes `jax.nn.dot_product_attention` would round, and for
    dropout on the attention probabilities: `dropout`, a `boxwood.nn.Dropout`,
    applied with `key`)."""
    seq, heads, dim = q.shape
    kv_heads = k.shape[1]
    wide = q.dtype if jnp.finfo(q.dtype).bits > 32 else jnp.dtype(jnp.float32)
    grouped = q.reshape(seq, kv_heads, heads // kv_heads, dim).astype(wide)
    logits = jnp.einsum("qhgd,khd->hgqk", grouped, k.astype(wide)) / math.sqrt(dim)
    logits = jnp.where(mask[None, None], logits, jnp.finfo(wide).min)
    weights = jax.nn.softmax(logits, axis=-1)
    if dropout is not None:
        weights = dropout(weights, key=key)
    out = jnp.einsum("hgqk,khd->qhgd", weights, v.astype(wide))
    return out.reshape(seq, heads, dim).astype(v.dtype)


def attend(
    q: Float[Array, "q_seq heads dim"],
    k: Float[Array, "kv_seq kv_heads dim"],
    v: Float[Array, "kv_seq kv_heads dim"],
    step: Step,
    window: Any = None,
    *,
    dropout: Any = None,
    key: Any = None,
) -> Float[Array, "q_seq heads dim"]:
    """Causal attention of new tokens (at slots `step.slots`) to the keys at slots
    `0, 1, ...`, through `jax.nn.dot_product_attention`.

    With grouped-query attention each key/value head serves `heads // kv_heads`
    consecutive query heads; the keys are passed with their own head count (never
    repeated per query head). `window`: `None` (full attention), an int (a
    sliding window, static) or an int array (a window that is data, as a scanned
    layer's). Without a cache, left padding or a window that is data, the mask
    is `is_causal` (and `local_window_size`), with the padding of an
    `attention_mask` as segment ids, which lets a fused kernel be chosen (cuDNN's
    flash attention on a GPU, splash attention on a TPU: `_kernels`);
    otherwise it is an explicit boolean mask.

    `dropout` (a `boxwood.nn.Dropout`, with `key`) drops attention
    probabilities; only where it is active (training mode, `p > 0`) are the
    weights formed explicitly, so inference keeps the fused call.
    """
    static_window = window is None or isinstance(window, int)
    if dropout is not None and not dropout.inference and dropout.p > 0:
        mask = _visible(step, q.shape[0], k.shape[0], window)
        return _explicit(q, k, v, mask, dropout, key)
    if not (step.implementation is not None or fusable(q, k, v)):
        return _explicit(q, k, v, _visible(step, q.shape[0], k.shape[0], window))
    mask, local, segments = None, None, None
    causal = not step.cached and step.pad is None and static_window
    if causal:
        local = None if window is None else (window - 1, 0)
        if step.segments is not None:  # padding: a kernel's segment ids
            segments = (step.segments[0][None], step.segments[1][None])
    else:
        mask = _visible(step, q.shape[0], k.shape[0], window)[None, None]
    out = fused_attention(
        q[None],
        k[None],
        v[None],
        mask=mask,
        is_causal=causal,
        local_window_size=local,
        implementation=step.implementation,
        segment_ids=segments,
    )
    return out[0]
