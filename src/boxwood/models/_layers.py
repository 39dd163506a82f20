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

from .._module import set_fields
from ..nn import RotaryPositionalEmbedding, Stacked, State, StateIndex
from ..nn._fused import fusable, fused_attention
from ..nn._state import make_index as _make_index
from ._id_ranges import check_ids_below

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


Implementation = Literal["xla", "cudnn"] | None
IMPLEMENTATIONS = (None, "xla", "cudnn")
# The window of a layer with full attention, where windows are data: no distance
# between two slots reaches it.
FULL_WINDOW = int(np.iinfo(np.int32).max)


def check_implementation(model: str, implementation: Any) -> None:
    """`implementation` must be one of `jax.nn.dot_product_attention`'s."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"{model}: `attention_implementation` must be None (JAX's choice), "
            f"'xla' or 'cudnn', got {implementation!r}. Set it with "
            "`model.with_attention_implementation(...)`."
        )


class Step(NamedTuple):
    """What every layer of one call shares: the cache slot of the first new token
    (`start`), the number of leading slots that are left padding (`pad`, `None`:
    none), whether the keys come from a cache (`cached`), the attention
    implementation, and the call's `extent` (one more than its largest real
    position, which `dynamic` RoPE scaling reads; `None`: from the positions)."""

    start: Any
    pad: Any = None
    cached: bool = False
    implementation: Implementation = None
    extent: Any = None

    def slots(self, seq: int) -> Array:
        """The cache slots of `seq` new tokens."""
        return self.start + jnp.arange(seq)

    def positions(self, seq: int) -> Array:
        """The positions of `seq` new tokens: their slots less the padding (pad
        slots themselves at position 0)."""
        slots = self.slots(seq)
        return slots if self.pad is None else jnp.maximum(slots - self.pad, 0)


def _visible(step: Step, q_seq: int, kv_seq: int, window: Any) -> Array:
    """`(q_seq, kv_seq)`: whether each new token may attend to each key slot:
    slots up to its own, after `slot - window` (a sliding `window`), and none of
    the padding. A pad token attends to itself alone, so that its (unused)
    output stays finite."""
    distance = step.slots(q_seq)[:, None] - jnp.arange(kv_seq)[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    if step.pad is not None:
        real = (jnp.arange(kv_seq) >= step.pad)[None, :]
        allowed = allowed & (real | (distance == 0))
    return allowed


def _explicit(q: Array, k: Array, v: Array, mask: Array) -> Array:
    """Grouped-query attention with the weights formed explicitly, in at least
    float32 (for dtypes `jax.nn.dot_product_attention` would round)."""
    seq, heads, dim = q.shape
    kv_heads = k.shape[1]
    wide = jnp.promote_types(q.dtype, jnp.float32)
    grouped = q.reshape(seq, kv_heads, heads // kv_heads, dim).astype(wide)
    logits = jnp.einsum("qhgd,khd->hgqk", grouped, k.astype(wide)) / math.sqrt(dim)
    logits = jnp.where(mask[None, None], logits, jnp.finfo(wide).min)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("hgqk,khd->qhgd", weights, v.astype(wide))
    return out.reshape(seq, heads, dim).astype(v.dtype)


def attend(
    q: Float[Array, "q_seq heads dim"],
    k: Float[Array, "kv_seq kv_heads dim"],
    v: Float[Array, "kv_seq kv_heads dim"],
    step: Step,
    window: Any = None,
) -> Float[Array, "q_seq heads dim"]:
    """Causal attention of new tokens (at slots `step.slots`) to the keys at slots
    `0, 1, ...`, through `jax.nn.dot_product_attention`.

    With grouped-query attention each key/value head serves `heads // kv_heads`
    consecutive query heads; the keys are passed with their own head count (never
    repeated per query head). `window`: `None` (full attention), an int (a
    sliding window, static) or an int array (a window that is data, as a scanned
    layer's). Without a cache, padding or a window that is data, the mask is
    `is_causal` (and `local_window_size`), which lets cuDNN's flash attention be
    chosen on a GPU (`nn._attention.fused_attention`); otherwise it is an explicit
    boolean mask.
    """
    static_window = window is None or isinstance(window, int)
    if not (step.implementation is not None or fusable(q, k, v)):
        return _explicit(q, k, v, _visible(step, q.shape[0], k.shape[0], window))
    mask, local = None, None
    causal = not step.cached and step.pad is None and static_window
    if causal:
        local = None if window is None else (window - 1, 0)
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
    """`x` through the stacked `blocks` in one scan, each called as
    `block(x, step, cache, layer, window) -> (x, cache)`; the key/value cache of
    every layer is `state`'s entry `index` (or `None`), carried through."""
    shared, per_layer = layer_windows(windows or (None,) * len(blocks))
    cache = None if state is None else state.get(index)

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
        _make_index(x.marker, (zeros, zeros))
        for x in jtu.tree_leaves(model, is_leaf=lambda x: isinstance(x, StateIndex))
        if isinstance(x, StateIndex)
    ]
    return State(indices)


def with_fields(module: Any, **values: Any) -> Any:
    """A copy of `module` with the given (static) fields replaced."""
    new = jtu.tree_map(lambda x: x, module)  # a fresh instance, seen by nobody
    set_fields(new, **values)
    return new
