"""What the architectures' blocks are made of and how they run: activations by
their `transformers` names, RoPE at given positions, the stacked key/value cache
held in a `boxwood.nn.State` (`write_cache`, `init_cache`), and the stacked blocks
applied in one scan (unrolled for a one-token decoding step; `run_blocks`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array

from .._module import set_fields
from ..nn import RotaryPositionalEmbedding, Stacked, State, StateIndex
from ._attend import Step

# The window of a layer with full attention, where windows are data: no distance
# between two slots reaches it.
FULL_WINDOW = int(np.iinfo(np.int32).max)

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
) -> tuple[Array, State | None, Array | None]:
    """`x` through the stacked `blocks`, each called as
    `block(x, step, cache, layer, window) -> (x, cache)`; the key/value cache of
    every layer is `state`'s entry `index` (or `None`), carried through. Returns
    the output, the state and, where `step.every_layer` (a call over no
    cache), the first block's input and every block's output (`with_inputs`),
    else `None`.

    In one scan (compile time flat in depth), except for one new token over a
    cache (a generation step): there the layers run one after the other with
    static indices, so that each layer's weights and cache are read in place
    from the stacks, where a scan would copy them out every step."""
    shared, per_layer = layer_windows(windows or (None,) * len(blocks))
    cache = None if state is None else state.get(index)
    if state is not None and x.shape[0] == 1:  # (no call asks for every layer)
        for i in range(len(blocks)):
            window = shared if per_layer is None else per_layer[i]
            x, cache = blocks[i](x, step, cache, i, window)
        return x, state.set(index, cache), None

    def body(block: Any, carry: tuple, inputs: tuple) -> tuple:
        h, kv = carry
        layer, window = inputs
        h, kv = block(h, step, kv, layer, shared if window is None else window)
        return (h, kv), (h if step.every_layer else None)

    first = x
    layers = jnp.arange(len(blocks), dtype=jnp.int32)
    (x, cache), ys = blocks.scan(body, (x, cache), (layers, per_layer))
    state = None if state is None else state.set(index, cache)
    return x, state, (with_inputs(first, ys) if step.every_layer else None)


def with_inputs(first: Array, outputs: Array) -> Array:
    """`transformers`' `hidden_states` of a stack of layers, `(depth + 1, ...)`:
    the first layer's input, then each layer's output (`outputs`, stacked by
    the scan)."""
    return jnp.concatenate([first[None], outputs.astype(first.dtype)])


def with_every_layer(out: Any, every: Array | None) -> Any:
    """A call's result: `out`, or `(out, every)` where every layer's hidden
    states were asked for (`output_hidden_states`)."""
    return out if every is None else (out, every)


def with_last(every: Array | None, last: Array) -> Array | None:
    """`every` (from `run_blocks`) with its last entry replaced by `last`: the
    causal LMs' final hidden state is the normalised one, as `transformers`
    returns it."""
    return None if every is None else every.at[-1].set(last)


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
        with_fields(x, init=(zeros, zeros))  # the same key, a cache as its value
        for x in jtu.tree_leaves(model, is_leaf=lambda x: isinstance(x, StateIndex))
        if isinstance(x, StateIndex)
    ]
    return State(indices)


def with_fields(module: Any, **values: Any) -> Any:
    """A copy of `module` with the given fields replaced (its other fields, and
    a `StateIndex`'s key, shared)."""
    new = jtu.tree_map(lambda x: x, module)  # a fresh instance, seen by nobody
    set_fields(new, **values)
    return new
