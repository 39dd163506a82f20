"""Pieces the architectures share: input checks, activations, causal attention over
a key/value cache held in a `boxwood.nn.State`, rotary embeddings at positions."""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float

from .._errors import error_if
from .._module import set_fields
from ..nn import RotaryPositionalEmbedding, Stacked, State, StateIndex
from ..nn._fused import fusable, fused_attention
from ..nn._state import make_index
from ._id_ranges import check_ids_below, known_in_range

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
    """`input_ids` must be a 1-D integer array (or a list of ints), not empty, no
    longer than the position table, of ids in `[0, vocab_size)`. Returns
    `input_ids` (a list as a NumPy array): under a trace the id check is
    attached to the returned array (`boxwood.error_if`), so use it."""
    if isinstance(input_ids, list | tuple):
        input_ids = np.asarray(input_ids)
    if jnp.ndim(input_ids) == 1 and jnp.shape(input_ids)[0] == 0:
        raise ValueError(f"{model}: `input_ids` is empty; give at least one token.")
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


def check_attention_mask(model: str, attention_mask: Any, shape: tuple) -> Any:
    """`attention_mask` (an array or lists) must have `input_ids`' `shape` and hold
    only 1 (a real token) and 0 (padding), as booleans or numbers. Returns it
    as an array: under a trace the value check is attached to it
    (`boxwood.error_if`, left out inside `ids_known_in_range()`), so use it."""
    if isinstance(attention_mask, list | tuple):
        attention_mask = np.asarray(attention_mask)
    dtype = jnp.result_type(attention_mask)
    if not (
        dtype == jnp.bool_
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.floating)
    ):
        raise TypeError(
            f"{model}: `attention_mask` must be an array of 1 (real token) and 0 "
            f"(padding), got dtype {dtype}."
        )
    if tuple(jnp.shape(attention_mask)) != tuple(shape):
        raise ValueError(
            f"{model}: `attention_mask` has shape {jnp.shape(attention_mask)}, but "
            f"`input_ids` has shape {tuple(shape)}; give one entry per token (1 real, "
            "0 padding)."
        )
    if dtype == jnp.bool_:
        return attention_mask
    rule = f"{model}: `attention_mask` must hold only 1 (a real token) and 0 (padding)"
    if isinstance(attention_mask, jax.core.Tracer):
        if known_in_range():
            return attention_mask
        bad = (attention_mask != 0) & (attention_mask != 1)
        checked: Any = error_if(attention_mask, bad, f"{rule}; got another value.")
        return checked
    values = np.asarray(attention_mask)
    where = np.flatnonzero((values != 0) & (values != 1))
    if where.size:
        first = int(where[0])
        at = tuple(int(i) for i in np.unravel_index(first, values.shape))
        raise ValueError(
            f"{rule}; got {values.reshape(-1)[first].item()!r} at position "
            f"{at[0] if len(at) == 1 else at}."
        )
    return attention_mask


def _ids_in_vocabulary(model: str, input_ids: Any, vocab_size: int) -> Any:
    """Without this check an id past the table would read its last row (JAX clamps
    gathers) and a negative one would wrap around."""
    rule = (
        f"{model}: `input_ids` must hold token ids from 0 to {vocab_size - 1} (the "
        f"vocabulary has {vocab_size} tokens, `vocab_size` in the config)"
    )
    return check_ids_below(
        model, "input_ids", input_ids, vocab_size, "vocab_size", rule
    )


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


Implementation = Literal["xla", "cudnn", "splash"] | None
IMPLEMENTATIONS = (None, "xla", "cudnn", "splash")
# The window of a layer with full attention, where windows are data: no distance
# between two slots reaches it.
FULL_WINDOW = int(np.iinfo(np.int32).max)


def check_implementation(model: str, implementation: Any) -> None:
    """`implementation` must be one of `nn._fused.fused_attention`'s."""
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
    segment), and the dropout key (`key`, `None` without dropout: layer `i`'s
    is `fold_in(key, i)`)."""

    start: Any
    pad: Any = None
    cached: bool = False
    implementation: Implementation = None
    extent: Any = None
    segments: tuple[Array, Array] | None = None
    key: Any = None

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
    wide = jnp.promote_types(q.dtype, jnp.float32)
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
    flash attention on a GPU, splash attention on a TPU: `nn._fused`);
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


Cache = tuple[Array, Array] | None  # keys, values: `(depth, length, kv_heads, dim)`


def write_cache(
    cache: Cache, layer: Array, k: Array, v: Array, start: Any
) -> tuple[Array, Array, Cache]:
    """The keys and values layer `layer` attends to: without a `cache` the new
    ones; with one (every layer's), its own after the new ones are written at
    slot `start`, and the updated cache."""
    if cache is None:
        return k, v, None
    at = (layer, jnp.asarray(start, jnp.int32), jnp.int32(0), jnp.int32(0))
    keys, values = (
        jax.lax.dynamic_update_slice(whole, new[None].astype(whole.dtype), at)
        for whole, new in zip(cache, (k, v), strict=True)
    )
    return keys[layer], values[layer], (keys, values)


def layer_windows(windows: tuple[int | None, ...]) -> tuple[Any, Array | None]:
    """`(shared, per_layer)`: the sliding window every layer has (static; `None`:
    full attention), or else `None` and each layer's as an int32 array (full
    attention as `FULL_WINDOW`), scanned with the layers."""
    if len(set(windows)) == 1:
        return windows[0], None
    per_layer = [FULL_WINDOW if w is None else w for w in windows]
    return None, jnp.asarray(per_layer, jnp.int32)


def run_blocks(
    blocks: Stacked,
    x: Array,
    step: Step,
    index: StateIndex,
    state: State | None,
    windows: tuple[int | None, ...] | None = None,
) -> tuple[Array, State | None]:
    """`x` through the stacked `blocks`, each called as
    `block(x, step, cache, layer, window) -> (x, cache)`; the key/value cache of
    every layer is `state`'s entry `index` (or `None`), carried through.

    In one scan (compile time flat in depth), except for one new token over a
    cache (a generation step): there the layers run one after the other with
    static indices, so that each layer's weights and cache are read in place
    from the stacks, where a scan would copy them out every step."""
    shared, per_layer = layer_windows(windows or (None,) * len(blocks))
    cache = None if state is None else state.get(index)
    if state is not None and x.shape[0] == 1:
        for i in range(len(blocks)):
            window = shared if per_layer is None else per_layer[i]
            x, cache = blocks[i](x, step, cache, i, window)
        return x, state.set(index, cache)

    def body(block: Any, carry: tuple, inputs: tuple) -> tuple:
        h, kv = carry
        layer, window = inputs
        h, kv = block(h, step, kv, layer, shared if window is None else window)
        return (h, kv), None

    layers = jnp.arange(len(blocks), dtype=jnp.int32)
    (x, cache), _ = blocks.scan(body, (x, cache), (layers, per_layer))
    return x, (None if state is None else state.set(index, cache))


def empty_cache_index() -> StateIndex:
    """A model's key into the cache: its value is made by `init_cache`."""
    return StateIndex(None)


def init_cache(model: Any, length: int, shapes: dict[str, Any]) -> State:
    """A `State` with an empty key/value cache of `length` positions for every
    `StateIndex` in `model`; `shapes` gives `depth`, `kv_heads`, `head_dim` and
    `dtype`: each cache is `(depth, length, kv_heads, head_dim)`."""
    shape = (shapes["depth"], length, shapes["kv_heads"], shapes["head_dim"])
    zeros = jnp.zeros(shape, shapes["dtype"])
    indices = [
        make_index(x.marker, (zeros, zeros))
        for x in jtu.tree_leaves(model, is_leaf=lambda x: isinstance(x, StateIndex))
        if isinstance(x, StateIndex)
    ]
    return State(indices)


def with_fields(module: Any, **values: Any) -> Any:
    """A copy of `module` with the given (static) fields replaced."""
    new = jtu.tree_map(lambda x: x, module)  # a fresh instance, seen by nobody
    set_fields(new, **values)
    return new
