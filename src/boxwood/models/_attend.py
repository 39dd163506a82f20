"""Causal self-attention of the architectures: the attention implementation
(`check_implementation`), what one call's layers share (`Step`: cache slot, left
padding, segment ids of an `attention_mask`, dropout key), which keys each query
may see (`_visible`), and `attend`: the fused kernels of `_kernels`
where they apply, the weights formed explicitly otherwise.

One new token over a cache (a decoding step) attends with two plain products
in the cache's own layout and the softmax in float32 where `DECODE_ATTENTION`
says so ("auto": on a TPU, unless the model names XLA's or cuDNN's attention),
and over a `_blocks.GroupedCache` layer (`Grouped`:
key/value heads side by side in 128-lane rows) always, with a block-diagonal
query. On a TPU v5e, `jax.nn.dot_product_attention`'s one-token call at batch
32 left transposes of its output in GPT-2-small's compiled step, and the same
step written by hand took 0.938 ms with the usual cache layout and 0.779 ms
with heads side by side (`benchmarks/results/2026-12-06-tpu-v5e-generate-profile.md`;
`benchmarks/decode_switches.py` times `generate` with each choice)."""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._kernels import fusable, fused_attention

# How one new token attends over a cache (a decoding step): "einsum" (two
# plain products in the cache's layout, the softmax in float32), "fused"
# (`jax.nn.dot_product_attention`, as a many-token call does) or "auto"
# ("einsum" on a TPU, "fused" elsewhere or where the model asks for XLA's or
# cuDNN's attention by name).
DECODE_ATTENTION = "auto"


def boxwood_decides(implementation: Any) -> bool:
    """Whether a decoding step's attention is boxwood's to choose: the model
    names no implementation, or splash attention, which takes no decoding step."""
    return implementation in (None, "splash")


def _einsum_decode(implementation: Any) -> bool:
    if DECODE_ATTENTION == "auto":
        return jax.default_backend() == "tpu" and boxwood_decides(implementation)
    return DECODE_ATTENTION == "einsum"


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


class Grouped(NamedTuple):
    """One layer's keys (or values) of a `_blocks.GroupedCache`, `(kv_heads // group,
    length, group * head_dim)`, as `_blocks.write_cache` hands them to `attend`."""

    rows: Array

    def ungrouped(self, head_dim: int) -> Array:
        """The usual layout, `(length, kv_heads, head_dim)`."""
        parts, length, width = self.rows.shape
        rows = jnp.swapaxes(self.rows, 0, 1)
        return rows.reshape(length, parts * (width // head_dim), head_dim)


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

    def position_rows(self, table: Array, seq: int) -> Array:
        """`table[self.positions(seq)]`, a learned position embedding's rows. From a
        known start without padding (a call without a cache, as in training) they
        are a slice, whose gradient is a pad where a gather's is a scatter-add of
        every row; otherwise (a decoding step) the rows are gathered."""
        start = self.start
        if self.pad is None and isinstance(start, int) and start + seq <= len(table):
            return table[start : start + seq]
        return table[self.positions(seq)]


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


def wide_dtype(dtype: Any) -> Any:
    """The dtype products and log-sum-exps over `dtype` are taken in: float64
    for float64, else float32 (not `jnp.promote_types`, which raises for
    bfloat16 under `jax_numpy_dtype_promotion="strict"`)."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _one_token(q: Array, k: Array, v: Array, visible: Array) -> Array:
    """One query `(1, heads, dim)` over keys and values `(kv_seq, kv_heads,
    dim)` where `visible` `(kv_seq,)`: products in the cache's own order,
    summed and normalised in float32."""
    _, heads, dim = q.shape
    kv_heads = k.shape[1]
    wide = wide_dtype(q.dtype)
    grouped = q.reshape(kv_heads, heads // kv_heads, dim)
    scores = jnp.einsum("hrd,thd->hrt", grouped, k, preferred_element_type=wide)
    scores = jnp.where(visible, scores / math.sqrt(dim), jnp.finfo(wide).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("hrt,thd->hrd", weights, v, preferred_element_type=wide)
    return out.reshape(1, heads, dim).astype(q.dtype)


def _one_token_grouped(q: Array, k: Array, v: Array, visible: Array) -> Array:
    """One query `(1, heads, dim)` over a `GroupedCache` layer's keys and values
    `(parts, kv_seq, g * dim)` (key/value head `p * g + i` in lanes `i * dim`
    to `(i + 1) * dim` of row part `p`). The query is laid out block-diagonally
    (query heads of head `i` hold their values in head `i`'s lanes, zeros
    elsewhere), so one product per row part scores every head against its own
    keys; of the output, each head keeps its own lanes."""
    _, heads, dim = q.shape
    parts, _, width = k.shape
    g = width // dim
    rep = heads // (parts * g)
    wide = wide_dtype(q.dtype)
    eye = jnp.eye(g, dtype=q.dtype)[None, :, None, :, None]
    blocks = q.reshape(parts, g, rep, 1, dim) * eye  # (parts, g, rep, g, dim)
    blocks = blocks.reshape(parts, g, rep, width)
    scores = jnp.einsum("pire,pte->pirt", blocks, k, preferred_element_type=wide)
    scores = jnp.where(visible, scores / math.sqrt(dim), jnp.finfo(wide).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("pirt,pte->pire", weights, v, preferred_element_type=wide)
    out = (out.reshape(parts, g, rep, g, dim) * eye.astype(wide)).sum(axis=3)
    return out.reshape(1, heads, dim).astype(q.dtype)


def attend(
    q: Float[Array, "q_seq heads dim"],
    k: Float[Array, "kv_seq kv_heads dim"] | Grouped,
    v: Float[Array, "kv_seq kv_heads dim"] | Grouped,
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

    One new token over a cache (a decoding step) is attended with two plain
    products in the cache's own layout where `DECODE_ATTENTION` says so
    ("einsum", or "auto" on a TPU unless `step.implementation` is "xla" or
    "cudnn"; see the module docstring). `k` and `v` may be a `GroupedCache` layer's
    (`_blocks.Grouped`): one token attends to them with a block-diagonal
    query; more tokens (a prefill) to the keys and values laid out as usual.
    """
    static_window = window is None or isinstance(window, int)
    dropping = dropout is not None and not dropout.inference and dropout.p > 0
    one_token = q.shape[0] == 1 and step.cached and not dropping
    if isinstance(k, Grouped) and isinstance(v, Grouped) and one_token:
        mask = _visible(step, 1, k.rows.shape[1], window)[0]
        return _one_token_grouped(q, k.rows, v.rows, mask)
    k = k.ungrouped(q.shape[-1]) if isinstance(k, Grouped) else k
    v = v.ungrouped(q.shape[-1]) if isinstance(v, Grouped) else v
    if one_token and _einsum_decode(step.implementation):
        mask = _visible(step, 1, k.shape[0], window)[0]
        return _one_token(q, k, v, mask)
    if dropping:
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
