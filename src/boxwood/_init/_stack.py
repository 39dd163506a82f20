"""Build `depth` layers one by one on the fast path and stack their arrays on the
host: what `nn.Stacked` does instead of `filter_vmap(make_layer)(keys)`.

Why: eager `vmap` runs each operation of the constructor as its own batched
kernel, compiled per shape; for a 12-block transformer (d=128) that is about 20 s
of compiling on a 2-core machine. Built one by one, the layers reuse the shared
draw kernels (see `_draw.py`) and the same arrays come out, bit for bit: a
threefry draw under `vmap` is the draw for each key (tests/init/test_init.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._keys import host_key, split_keys


def _stack_leaf(values: list) -> Any:
    """The stacked array, the shared non-array value, or `None` if neither."""
    first = values[0]
    if isinstance(first, (jax.Array, np.ndarray)):
        if not all(isinstance(v, (jax.Array, np.ndarray)) for v in values):
            return None
        if any(isinstance(v, jax.core.Tracer) for v in values):
            return None
        if jnp.issubdtype(first.dtype, jax.dtypes.prng_key):
            return None
        if len({(v.shape, v.dtype) for v in values}) != 1:
            return None
        return (jax.device_put(np.stack([np.asarray(v) for v in values])),)
    try:
        same = all(v is first or bool(v == first) for v in values[1:])
    except Exception:
        return None
    return (first,) if same else None


def build_stacked(
    make_layer: Callable[[Any], Any], depth: int, key: Any
) -> tuple[Any] | None:
    """`(layers,)`: `make_layer` applied to each of `split(key, depth)`, with every
    array leaf stacked along a new leading axis; the same tree as
    `filter_vmap(make_layer)(jax.random.split(key, depth))`.

    **Returns:** `None` where this does not apply (the caller then uses
    `filter_vmap`): a key that cannot be split on the host, layers of different
    structures, or non-array leaves that differ between layers.
    """
    if host_key(key) is None:
        return None
    layers = [make_layer(k) for k in split_keys(key, depth)]
    flat = [jax.tree_util.tree_flatten(layer) for layer in layers]
    treedef = flat[0][1]
    if any(t != treedef for _, t in flat[1:]):
        return None
    stacked = []
    for values in zip(*(leaves for leaves, _ in flat)):
        leaf = _stack_leaf(list(values))
        if leaf is None:
            return None
        stacked.append(leaf[0])
    return (treedef.unflatten(stacked),)
