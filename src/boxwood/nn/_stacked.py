"""`Stacked`: `depth` identical layers stored as one module with stacked arrays."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.random as jr
import jax.tree_util as jtu
from jaxtyping import Array, PRNGKeyArray

from .._filters import is_array
from .._init import build_stacked
from .._module import Module, field, set_fields
from .._transforms import filter_checkpoint, filter_scan, filter_vmap, unrolled_scan

# `jax.checkpoint_policies` that are policies themselves (the others make one).
_POLICIES = (
    "checkpoint_dots",
    "checkpoint_dots_with_no_batch_dims",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "everything_saveable",
    "nothing_saveable",
)


def _check_remat(remat: Any) -> Any:
    """`remat` as stored: `False` (off), `True` (everything recomputed), a
    policy name of `_POLICIES` or a policy function."""
    if remat is None or remat is False:
        return False
    if remat is True or remat == "full":
        return True
    if (isinstance(remat, str) and remat in _POLICIES) or (
        callable(remat) and not isinstance(remat, str)
    ):
        return remat
    if remat == "auto":
        raise ValueError(
            "Stacked: `remat='auto'` needs the step it is for: "
            "`model, choice = boxwood.models.choose_remat(step, model, *args)` "
            "compiles the step with each policy and keeps the fastest that fits "
            "the device."
        )
    raise ValueError(
        f"Stacked: `remat` must be False/None (off), True or 'full' (recompute "
        f"each layer on the backward pass), a `jax.checkpoint_policies` name "
        f"({', '.join(_POLICIES)}) or a policy function; got {remat!r}."
    )


def _check_unroll(unroll: Any) -> int | bool:
    """`unroll` as stored: `True` (a Python loop over the layers) or a positive
    int, the layers per iteration of the scan (`False` is `1`)."""
    if unroll is True:
        return True
    if unroll is False:
        return 1
    try:
        n = operator.index(unroll)
    except TypeError:
        n = 0
    if n >= 1:
        return n
    raise ValueError(
        f"Stacked: `unroll` must be a positive int (the layers per iteration of the "
        f"scan; 1, the default, scans one layer at a time), True (unroll all the "
        f"layers: no scan) or False (the same as 1); got {unroll!r}."
    )


class Stacked(Module):
    """A stack of `depth` layers of the same structure, applied in order.

    The layers are held as *one* layer whose arrays have a leading axis of size
    `depth` (`jax.tree.map(lambda a: a[i], stacked.layers)` is layer `i`): the
    arrays [`boxwood.filter_vmap`][] of `make_layer` over the split keys gives,
    built one by one on boxwood's fast initialisation path and stacked (far fewer
    compiles; `filter_vmap` itself where that does not apply). They are applied
    with [`boxwood.filter_scan`][]: the model compiles once however deep it is.
    `unroll` trades that for a program that holds every layer (the compiler may
    then schedule across layers, and reads each layer's weights at static
    positions): `unroll=True` applies the layers in a Python loop, `unroll=n`
    unrolls `n` layers per iteration of the scan.

    ```python
    blocks = boxwood.nn.Stacked(lambda k: Block(64, key=k), depth=12, key=key)
    y = blocks(x)
    ```

    It reads as a sequence of layers: `blocks[i]` is layer `i` (its arrays
    sliced), `len(blocks)` the depth, and `for block in blocks` iterates over
    them. Layers that take more than one input, or carry more than one value,
    are applied with `blocks.scan(fn, carry, xs)`.
    """

    layers: Any
    depth: int = field(static=True)
    remat: Any = field(static=True)
    unroll: int | bool = field(static=True)

    def __init__(
        self,
        make_layer: Callable[[PRNGKeyArray], Any],
        depth: int,
        *,
        key: PRNGKeyArray,
        remat: bool = False,
        unroll: int | bool = 1,
    ):
        """**Arguments:**

        - `make_layer`: `key -> layer`, building one layer. Every layer must have the
          same structure (the same static fields); their arrays may differ.
        - `depth`: the number of layers, a positive int.
        - `key`: a `jax.random` key, split into one key per layer.
        - `remat`: whether to rematerialise each layer's activations on the backward
          pass (see [`boxwood.filter_checkpoint`][]), saving memory: `False` or
          `None` (no), `True` or `"full"` (recompute everything), or a
          `jax.checkpoint_policies` name such as `"dots_saveable"` (keep what it
          saves), or such a policy function. (Keyword only.)
        - `unroll`: how the layers are looped over: `1` (the default; `False` is the
          same) scans one layer per iteration, so compile time does not grow with
          `depth`; an int `n > 1` is `jax.lax.scan`'s `unroll=n` (`n` layers per
          iteration, unrolled when the scan is compiled); `True` applies the layers
          one after the other in a Python loop, each (rematerialised as `remat`
          says) in the traced program, with no scan: compile time grows with
          `depth`. The results are the same. (Keyword only.)
        """
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"Stacked: `depth` must be a positive int, got {depth!r}.")
        built = build_stacked(make_layer, depth, key)
        if built is None:
            built = (filter_vmap(make_layer)(jr.split(key, depth)),)
        self.layers = built[0]
        self.depth = depth
        self.remat = _check_remat(remat)
        self.unroll = _check_unroll(unroll)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """**Arguments:**

        - `x`: the input of the first layer; each layer's output is the next one's
          input (so it must keep its shape and dtype).
        - `key`: optional; when given, it is split and each layer is called as
          `layer(x, key=k)`. Otherwise layers are called as `layer(x)`.

        **Returns:**

        The output of the last layer.
        """

        def step(layer: Any, h: Array, k: Any) -> tuple[Array, None]:
            return (layer(h) if k is None else layer(h, key=k)), None

        keys = None if key is None else jr.split(key, self.depth)
        out, _ = self.scan(step, x, keys)
        return out

    def scan(
        self, fn: Callable[[Any, Any, Any], tuple[Any, Any]], carry: Any, xs: Any = None
    ) -> tuple[Any, Any]:
        """Apply the layers in order with [`boxwood.filter_scan`][] (unrolled as
        `unroll` says), each step `carry, y = fn(layer, carry, x)` (checkpointed
        as `remat` says, each layer on its own).

        **Arguments:**

        - `fn`: `(layer, carry, x) -> (carry, y)`; `layer` is one layer (its
          arrays sliced), `x` the layer's slice of `xs`.
        - `carry`: the initial carry (it must keep its structure).
        - `xs`: optional per-layer inputs, arrays with a leading axis of size
          `depth` (or `None`).

        **Returns:** `(final_carry, ys)`, the `y`s stacked along a leading axis.
        """

        def step(c: Any, layer_and_x: tuple[Any, Any]) -> tuple[Any, Any]:
            layer, x = layer_and_x
            return fn(layer, c, x)

        if self.remat is not False:
            policy = self.remat
            if isinstance(policy, str):
                policy = getattr(jax.checkpoint_policies, policy)
            step = filter_checkpoint(step, policy=None if policy is True else policy)
        if self.unroll is True:
            return unrolled_scan(step, carry, (self.layers, xs), self.depth)
        return filter_scan(
            step, carry, (self.layers, xs), length=self.depth, unroll=self.unroll
        )

    def with_remat(self, remat: Any) -> Stacked:
        """A copy with another `remat` setting (as in `__init__`)."""
        return self._with(remat=_check_remat(remat))

    def with_unroll(self, unroll: int | bool) -> Stacked:
        """A copy with another `unroll` setting (as in `__init__`); the arrays are
        shared, checkpoints (`state_dict` keys) unchanged."""
        return self._with(unroll=_check_unroll(unroll))

    def _with(self, **fields: Any) -> Stacked:
        new = jtu.tree_map(lambda a: a, self)  # a fresh instance, seen by nobody
        set_fields(new, **fields)
        return new

    def __len__(self) -> int:
        return self.depth

    def __getitem__(self, i: int) -> Any:
        """Layer `i`: the layer with its arrays sliced at `i` (negative `i` counts
        from the end)."""
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(
                f"Stacked: a layer index must be an int, got {type(i).__name__}; "
                "for several layers use a list comprehension over the stack."
            ) from None
        if not -self.depth <= i < self.depth:
            raise IndexError(
                f"Stacked: layer {i} is out of range for a stack of {self.depth}."
            )
        return jtu.tree_map(lambda a: a[i] if is_array(a) else a, self.layers)

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(self.depth))
