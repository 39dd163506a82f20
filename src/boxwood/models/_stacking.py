"""Stacked layers under their per-layer checkpoint names.

A `boxwood.nn.Stacked` at path `P` holds `depth` layers as one layer whose arrays
have a leading axis of size `depth`; its leaf at inner path `R` (below the
Stacked's own `layers` attribute) is the checkpoint's tensors `P.0.R` ...
`P.{depth-1}.R`. Everything here works on the *layer view* of a tree: the tree
with each `Stacked` replaced by a list of its `depth` layers, whose dotted paths
are exactly the names an unrolled model (a list of layers at `P`) has. Nested
stacks unroll one level at a time (`P.i.Q.j.R`).

A tree without a `Stacked` is its own layer view: every function here then gives
what the plain tree gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._checkpoint import Part, state_dict
from .._paths import dotted_path
from .._sharding import named_shardings
from ..nn import Stacked

# The attribute of `Stacked` that holds the stacked layer; it is not part of a
# checkpoint name (`P.layers.R` is stored as `P.0.R`, `P.1.R`, ...).
STACKED_FIELD = "layers"


@dataclasses.dataclass(frozen=True)
class Slot:
    """One per-layer tensor of a tree's layer view: the dotted path of the leaf it
    is part of (`source`), the index into that leaf's leading (stacked) axes
    (`()` for a leaf under no `Stacked`), and the tensor's own shape and dtype."""

    source: str
    index: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: Any

    def layer(self, i: int) -> Slot:
        return Slot(self.source, (*self.index, i), self.shape[1:], self.dtype)


def _is_array(x: Any) -> bool:
    # the leaves a checkpoint stores (as `boxwood._checkpoint.stored_names` counts)
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _is_slot(x: Any) -> bool:
    return isinstance(x, Slot)


def _is_stack(x: Any) -> bool:
    return isinstance(x, Stacked)


def has_stacks(tree: Any) -> bool:
    """Whether `tree` holds a `boxwood.nn.Stacked` anywhere."""
    return any(_is_stack(x) for x in jtu.tree_leaves(tree, is_leaf=_is_stack))


def _marked(tree: Any) -> Any:
    """`tree` with each array leaf replaced by its `Slot` (path, no index)."""
    flat, treedef = jtu.tree_flatten_with_path(tree)
    return treedef.unflatten(
        [
            Slot(dotted_path(p), (), tuple(x.shape), x.dtype) if _is_array(x) else x
            for p, x in flat
        ]
    )


def _unrolled(marked: Any) -> Any:
    """`marked` with each `Stacked` replaced by the list of its layers."""
    flat, treedef = jtu.tree_flatten(
        marked, is_leaf=lambda x: _is_stack(x) or _is_slot(x)
    )
    return treedef.unflatten(
        [_layers(x) if isinstance(x, Stacked) else x for x in flat]
    )


def _layers(stack: Stacked) -> list[Any]:
    def take(i: int) -> Callable[[Any], Any]:
        return lambda x: x.layer(i) if _is_slot(x) else x

    for slot in jtu.tree_leaves(stack.layers, is_leaf=_is_slot):
        if _is_slot(slot):
            _check_depth(slot.source, slot.shape, 0, stack.depth)
    return [
        _unrolled(jtu.tree_map(take(i), stack.layers, is_leaf=_is_slot))
        for i in range(stack.depth)
    ]


def _check_depth(source: str, shape: tuple, axis: int, depth: int) -> None:
    if len(shape) <= axis or shape[axis] != depth:
        raise ValueError(
            f"`{source}` has shape {shape}, but the `Stacked` holding it has depth "
            f"{depth}: each array of a `Stacked`'s layers needs a leading axis of "
            "size `depth`."
        )


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


# (name in the layer view, path of the leaf, index into its stacked axes, leaf)
_Entry = tuple[str, str, tuple[int, ...], Any]


def _entries(tree: Any, outer: int, at: str) -> list[_Entry]:
    """The layer view's tensors of `tree` (at path `at` of the whole tree), whose
    arrays have `outer` leading axes of enclosing stacks; each stack's layers are
    walked once, then named per index."""
    out: list[_Entry] = []
    for path, x in jtu.tree_flatten_with_path(tree, is_leaf=_is_stack)[0]:
        part = dotted_path(path)
        if isinstance(x, Stacked):
            inner = _entries(x.layers, outer + 1, _join(at, part, STACKED_FIELD))
            for _, source, _, leaf in inner:
                _check_depth(source, tuple(leaf.shape), outer, x.depth)
            out += [
                (_join(part, str(i), name), source, (i, *index), leaf)
                for i in range(x.depth)
                for name, source, index, leaf in inner
            ]
        elif _is_array(x):
            out.append((part, _join(at, part), (), x))
    return out


def layer_slots(tree: Any) -> dict[str, Slot]:
    """Every per-layer tensor of `tree` by its name in the layer view, in the
    order an unrolled model flattens (all of layer 0's tensors, then layer 1's)."""
    return {
        name: Slot(source, index, tuple(leaf.shape)[len(index) :], leaf.dtype)
        for name, source, index, leaf in _entries(tree, 0, "")
    }


def layer_names(tree: Any) -> list[str]:
    """The names of `tree`'s array leaves as an unrolled model has them (each
    stacked leaf once per layer), in an unrolled model's order."""
    return list(layer_slots(tree))


def layer_view(tree: Any) -> Any:
    """An abstract tree of `tree`'s layer view: each `Stacked` replaced by a list
    of its layers, whose array leaves are `jax.ShapeDtypeStruct`s of one layer."""
    return jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if _is_slot(x) else x,
        _unrolled(_marked(tree)),
        is_leaf=_is_slot,
    )


def layer_arrays(tree: Any) -> Iterator[tuple[str, np.ndarray]]:
    """`(name, array)` for every per-layer tensor of a real `tree`, as host NumPy
    arrays (a stacked leaf's layers are views of its one host copy), in an
    unrolled model's order: what `boxwood.state_dict` gives for the unrolled
    model."""
    host = state_dict(tree)
    for name, slot in layer_slots(tree).items():
        array = host[slot.source]
        yield name, (array[slot.index] if slot.index else array)


def layer_parts(tree: Any) -> dict[str, Part]:
    """Where each tensor of `tree`'s layer view goes in `tree`: `{name: Part(path
    of the leaf, index into its stacked axes)}`, in an unrolled model's order
    (the plan `boxwood._checkpoint.assemble(..., parts=...)` reads a stacked
    leaf's layers by)."""
    return {
        name: Part(slot.source, slot.index) for name, slot in layer_slots(tree).items()
    }


def layer_shardings(tree: Any, mesh: Any, rules: Any) -> Any:
    """`boxwood.named_shardings(tree, mesh, rules)` with each rule matched against
    the per-layer names (and shapes) of a stacked leaf, and the leading stacked
    axes left whole (`None` prepended to the spec).

    **Raises:** `ValueError` naming the leaf when the rules split its layers
    differently (a `Stacked` holds one sharding for all of them).
    """
    if not has_stacks(tree):
        return named_shardings(tree, mesh, rules)
    per_layer = jtu.tree_flatten_with_path(
        named_shardings(layer_view(tree), mesh, rules)
    )[0]
    specs = {dotted_path(p): s.spec for p, s in per_layer}
    by_source: dict[str, PartitionSpec] = {}
    for name, slot in layer_slots(tree).items():
        spec = PartitionSpec(*([None] * len(slot.index)), *specs[name])
        first = by_source.setdefault(slot.source, spec)
        if first != spec:
            raise ValueError(
                f"The sharding rules split the layers of `{slot.source}` "
                f"differently (`{name}`: {specs[name]}, layer 0: "
                f"{PartitionSpec(*first[len(slot.index) :])}); the layers of a "
                "`boxwood.nn.Stacked` share one sharding, so give them one rule."
            )
    return jtu.tree_map(
        lambda x: NamedSharding(mesh, by_source[x.source]) if _is_slot(x) else None,
        _marked(tree),
        is_leaf=_is_slot,
    )


def with_layer_shardings(tree: Any, mesh: Any, rules: Any) -> Any:
    """The abstract `tree` with each array leaf given its `layer_shardings`."""
    shardings = layer_shardings(tree, mesh, rules)

    def put(x: Any, s: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct) and s is not None:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
        return x

    return jtu.tree_map(put, tree, shardings, is_leaf=lambda x: x is None)


@dataclasses.dataclass(frozen=True)
class PerLayer:
    """A sharding rule's spec for a stacked leaf: `spec` (a `PartitionSpec`,
    `None` or a callable of the shape and mesh) applied to one layer's shape, with
    the leading stacked axis left whole."""

    spec: Any

    def __call__(self, shape: tuple, mesh: Any) -> PartitionSpec:
        spec: Any = self.spec
        if callable(spec) and not isinstance(spec, PartitionSpec):
            spec = spec(tuple(shape[1:]), mesh)
        return PartitionSpec(None, *(() if spec is None else spec))

    def __repr__(self) -> str:
        return f"per_layer({self.spec!r})"
