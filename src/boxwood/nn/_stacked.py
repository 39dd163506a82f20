"""`Stacked`: `depth` identical layers stored as one module with stacked arrays."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.random as jr
from jaxtyping import Array, PRNGKeyArray

from .._init import build_stacked
from .._module import Module, field
from .._remat import filter_checkpoint
from .._scan import filter_scan
from .._vmap import filter_vmap


class Stacked(Module):
    """A stack of `depth` layers of the same structure, applied in order.

    The layers are held as *one* layer whose arrays have a leading axis of size
    `depth` (`jax.tree.map(lambda a: a[i], stacked.layers)` is layer `i`): the
    arrays [`boxwood.filter_vmap`][] of `make_layer` over the split keys gives,
    built one by one on boxwood's fast initialisation path and stacked (far fewer
    compiles; `filter_vmap` itself where that does not apply). They are applied with [`boxwood.filter_scan`][]:
    the model compiles once however deep it is.

    ```python
    blocks = boxwood.nn.Stacked(lambda k: Block(64, key=k), depth=12, key=key)
    y = blocks(x)
    ```
    """

    layers: Any
    depth: int = field(static=True)
    remat: bool = field(static=True)

    def __init__(
        self,
        make_layer: Callable[[PRNGKeyArray], Any],
        depth: int,
        *,
        key: PRNGKeyArray,
        remat: bool = False,
    ):
        """**Arguments:**

        - `make_layer`: `key -> layer`, building one layer. Every layer must have the
          same structure (the same static fields); their arrays may differ.
        - `depth`: the number of layers, a positive int.
        - `key`: a `jax.random` key, split into one key per layer.
        - `remat`: whether to rematerialise each layer's activations on the backward
          pass (see [`boxwood.filter_checkpoint`][]), saving memory.
        """
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"Stacked: `depth` must be a positive int, got {depth!r}.")
        built = build_stacked(make_layer, depth, key)
        if built is None:
            built = (filter_vmap(make_layer)(jr.split(key, depth)),)
        self.layers = built[0]
        self.depth = depth
        self.remat = remat

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """**Arguments:**

        - `x`: the input of the first layer; each layer's output is the next one's
          input (so it must keep its shape and dtype).
        - `key`: optional; when given, it is split and each layer is called as
          `layer(x, key=k)`. Otherwise layers are called as `layer(x)`.

        **Returns:**

        The output of the last layer.
        """

        def step(h: Array, layer_and_key: tuple[Any, Any]) -> tuple[Array, None]:
            layer, k = layer_and_key
            return (layer(h) if k is None else layer(h, key=k)), None

        if self.remat:
            step = filter_checkpoint(step)
        keys = None if key is None else jr.split(key, self.depth)
        out, _ = filter_scan(step, x, (self.layers, keys), length=self.depth)
        return out
