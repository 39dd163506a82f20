"""What the architectures' blocks are made of and how they run: activations by
their `transformers` names, RoPE at given positions, the stacked key/value cache
held in a `boxwood.nn.State` (`write_cache`, `init_cache`; for `generate`'s loop
also as a `GroupedCache`, heads side by side in 128-lane rows, where
`GROUP_HEADS` says so: `grouped_cache`), and the stacked blocks applied in one
scan (unrolled for a one-token decoding step; `run_blocks`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array

from .._module import set_fields
from ..nn import RotaryPositionalEmbedding, Stacked, State, StateIndex
from ._attend import Grouped, Step, boxwood_decides

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


class GroupedCache(NamedTuple):
    """A key/value cache with `group` key/value heads side by side in each row:
    keys and values `(depth, kv_heads // group, length, group * head_dim)`, the
    layout `generate`'s loop may hold (`grouped_cache`). A TPU stores an
    array's minor dimension in rows of 128 lanes, so 64-wide heads held one to
    a row (`(depth, length, kv_heads, head_dim)`) are read twice over; two of
    them side by side fill a row."""

    keys: Array
    values: Array


# keys, values: `(depth, length, kv_heads, dim)`, or a `GroupedCache`
Cache = tuple[Array, Array] | GroupedCache | None

# Whether `generate`'s loop holds its cache as a `GroupedCache`: "auto" (on a
# TPU, over several rows, where whole 128-lane rows are filled, unless the
# model names XLA's or cuDNN's attention), "always"
# (where any two heads fit a row: tests run it on a CPU) or "never". On a TPU
# v5e GPT-2-small's step at batch 32 took 0.995 ms so against 1.278 ms, and at
# batch 1 0.288 against 0.282 ms (benchmarks/results/2026-12-06-tpu-v5e-decode-switches.md).
GROUP_HEADS = "auto"
_LANES = 128


def group_size(
    kv_heads: int, head_dim: int, rows: int = 2, implementation: Any = None
) -> int:
    """How many key/value heads `grouped_cache` puts side by side in one row
    for a loop over `rows` rows under `GROUP_HEADS` (1: none): the most that
    divide `kv_heads` and fit 128 lanes; under "auto" only on a TPU, over
    several rows, where they fill the row, and for a model whose attention
    `implementation` is boxwood's to choose (`_attend.boxwood_decides`)."""
    if GROUP_HEADS == "never" or head_dim >= _LANES:
        return 1
    fit = max(g for g in range(1, _LANES // head_dim + 1) if kv_heads % g == 0)
    if GROUP_HEADS == "always":
        return fit
    filled = fit * head_dim == _LANES
    wanted = filled and rows > 1 and jax.default_backend() == "tpu"
    wanted = wanted and boxwood_decides(implementation)
    return fit if wanted else 1


def grouped_cache(model: Any, state: State, rows: int = 2) -> State:
    """`state` (from `model.init_cache`, empty) with each key/value cache
    replaced by an empty `GroupedCache` of the same length, where `group_size`
    groups its heads for a loop over `rows` rows and `model`'s attention
    implementation; else (or where `model` holds no `StateIndex`) `state` itself."""
    indices = [
        x
        for x in jtu.tree_leaves(model, is_leaf=lambda x: isinstance(x, StateIndex))
        if isinstance(x, StateIndex)
    ]
    implementation = getattr(model, "attention_implementation", None)
    grouped = []
    for index in indices:
        keys, _ = state.get(index)
        depth, length, kv_heads, head_dim = keys.shape
        g = group_size(kv_heads, head_dim, rows, implementation)
        if g == 1:
            return state
        shape = (depth, kv_heads // g, length, g * head_dim)
        zeros = jnp.zeros(shape, keys.dtype)
        grouped.append(with_fields(index, init=GroupedCache(zeros, zeros)))
    return State(grouped) if grouped else state  # (a model without an index)


def write_cache(
    cache: Cache, layer: Array, k: Array, v: Array, start: Any
) -> tuple[Any, Any, Cache]:
    """The keys and values layer `layer` attends to: without a `cache` the new
    ones; with one (every layer's), its own after the new ones are written at
    slot `start`, and the updated cache. From a `GroupedCache`, the layer's
    keys and values are each `Grouped`."""
    if cache is None:
        return k, v, None
    slot = jnp.asarray(start, jnp.int32)
    zero = jnp.int32(0)
    if isinstance(cache, GroupedCache):
        parts, width = cache.keys.shape[1], cache.keys.shape[3]
        at = (layer, zero, slot, zero)
        # `(seq, kv_heads, dim)` as rows: `(1, parts, seq, width)`
        rows = lambda x: jnp.swapaxes(x.reshape(x.shape[0], parts, width), 0, 1)  # noqa: E731
        keys, values = (
            jax.lax.dynamic_update_slice(whole, rows(new)[None].astype(whole.dtype), at)
            for whole, new in zip(cache, (k, v), strict=True)
        )
        return Grouped(keys[layer]), Grouped(values[layer]), GroupedCache(keys, values)
    at = (layer, slot, zero, zero)
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
