"""The shape an initialiser sees: JAX's convention, whatever boxwood stores.

JAX's and Flax's initialisers read a weight's fan-in from axis -2 and its fan-out
from axis -1, with any further leading axes as the receptive field: a dense kernel
is `(in, out)`, a convolution's `(*spatial, in, out)`. boxwood stores PyTorch's
layouts, `(out, in)` and `(out, in, *spatial)`. So a user's initialiser is called
with the parameter's shape in JAX's convention and its result is transposed into
boxwood's; a convolution's bias, stored as `(out, 1, ..., 1)`, is drawn as
`(out,)`. The same initialiser therefore gives a boxwood layer the distribution it
gives Flax's equivalent layer.

A layout is one of:

- `"dense"`: stored `(out, in)`, drawn `(in, out)` (`Linear`, the RNN cells'
  weights, `MultiheadAttention`'s projections);
- `"conv"`: stored `(out, in, *spatial)`, drawn `(*spatial, in, out)` (every
  `Conv*` and `ConvTranspose*` weight);
- `"channel_bias"`: stored `(out, 1, ..., 1)`, drawn `(out,)`;
- `None`: drawn as stored (biases, `Embedding`'s `(num_embeddings, size)` table,
  norms' scales and anything else).

A layer names the layouts of its fields in the class attribute `_init_layouts`,
which `nn.init` reads.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import numpy as np
from jax.tree_util import DictKey, GetAttrKey, SequenceKey


def drawn_shape(shape: tuple[int, ...], layout: str | None) -> tuple[int, ...]:
    """The shape, in JAX's convention, in which a parameter stored as `shape` is
    drawn."""
    if layout == "dense" and len(shape) == 2:
        return (shape[1], shape[0])
    if layout == "conv" and len(shape) >= 2:
        return (*shape[2:], shape[1], shape[0])
    if layout == "channel_bias" and len(shape) >= 1:
        return (shape[0],)
    return tuple(shape)


def to_stored(value: Any, shape: tuple[int, ...], layout: str | None) -> Any:
    """`value`, drawn in `drawn_shape(shape, layout)`, in the stored layout.

    A concrete array on one device is transposed on the host and put back on its
    device: the same bits, without compiling an eager transpose for every shape
    (0.02-0.07 s each on two cores)."""
    if layout == "dense" and len(shape) == 2:
        axes: tuple[int, ...] | None = (1, 0)
    elif layout == "conv" and len(shape) >= 2:
        n = len(shape) - 2  # spatial axes come first in the drawn array
        axes = (n + 1, n, *range(n))
    elif layout == "channel_bias":
        return value.reshape(shape)
    else:
        return value
    if not _on_default_device(value):
        return value.transpose(axes)
    return jax.device_put(np.asarray(value).transpose(axes))


def _on_default_device(value: Any) -> bool:
    """Whether `value` is a concrete `jax.Array` placed as `jax.device_put` places
    a NumPy array (uncommitted, on one device), so that the host round trip gives
    back the same placement."""
    if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer):
        return False
    try:
        return not value.committed and len(value.devices()) == 1
    except Exception:  # a deleted or otherwise unreadable array: the eager path
        return False


_MISSING = object()


def _child(node: Any, entry: Any) -> Any:
    """The child of `node` at a key-path entry, or `_MISSING`."""
    if isinstance(entry, GetAttrKey):
        return getattr(node, entry.name, _MISSING)
    if isinstance(entry, SequenceKey):
        return node[entry.idx]
    if isinstance(entry, DictKey):
        return node[entry.key]
    return _MISSING


def layout_at(root: Any, path: tuple) -> tuple[str | None, int | None]:
    """The layout of the leaf at `path` (as from `tree_flatten_with_path`), the
    `_init_layouts` entry of the module holding it, and the number of axes one
    such parameter has (more axes are leading axes of stacked layers, as in
    `nn.Stacked`); `(None, None)` if the module declares none."""
    if not path or not isinstance(path[-1], GetAttrKey):
        return None, None
    node = root
    try:
        for entry in path[:-1]:
            node = _child(node, entry)
            if node is _MISSING:
                return None, None
    except (LookupError, TypeError):
        return None, None
    layouts = getattr(type(node), "_init_layouts", None)
    layout = layouts.get(path[-1].name) if isinstance(layouts, dict) else None
    if layout is None:
        return None, None
    spatial = getattr(node, "num_spatial_dims", 0)
    ndim = {"dense": 2, "conv": 2 + spatial, "channel_bias": 1 + spatial}[layout]
    return layout, ndim
