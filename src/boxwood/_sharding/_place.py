"""Moving arrays onto a mesh: `shard`, `named_shardings`, `shard_batch`, and
Equinox's `filter_shard`."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.core
import jax.tree_util as jtu
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._filters import is_array
from .._paths import dotted_path
from ._rules import entry_axes, mesh_axis_sizes, resolve


def named_shardings(tree: Any, mesh: jax.sharding.Mesh, rules: Any = ()) -> Any:
    """The `NamedSharding` that `shard` gives each array leaf, as a tree.

    The result has the structure of `tree`, with a `NamedSharding` at each array
    leaf and `None` at every other leaf, so it can be passed wherever JAX or boxwood
    takes a tree of shardings (`filter_shard`, `jax.device_put`).

    **Arguments:**

    - `tree`: any pytree (a model, an optimiser state, both in a tuple).
    - `mesh`: a `jax.sharding.Mesh`.
    - `rules`: `(pattern, spec)` pairs; see `shard`.

    **Returns:** the tree of shardings.
    """
    leaves, treedef, placements = resolve(tree, mesh, rules)
    out = [None if p is None else NamedSharding(mesh, p.spec) for p in placements]
    return jtu.tree_unflatten(treedef, out)


def shard(tree: Any, mesh: jax.sharding.Mesh, rules: Any = ()) -> Any:
    """Place every array leaf of `tree` on `mesh` with a `NamedSharding` chosen by
    `rules`.

    **Arguments:**

    - `tree`: any pytree; leaves that are not arrays are returned unchanged.
    - `mesh`: a `jax.sharding.Mesh` (for example `boxwood.make_mesh((8,), ("data",))`).
    - `rules`: an ordered sequence of `(pattern, spec)` pairs. `pattern` is a Python
        regular expression matched with `re.fullmatch` against each leaf's dotted
        path (`encoder.layers.3.weight`, the names checkpoints use); `spec` is a
        `jax.sharding.PartitionSpec`, `None` (replicated) or a callable
        `(shape, mesh) -> PartitionSpec | None`. The first matching rule wins;
        unmatched leaves are replicated. The strategies `data_parallel`, `fsdp`
        and `tensor_parallel` return such lists, which can be concatenated.

    **Returns:** a tree like `tree`, whose arrays are sharded over `mesh`.

    **Raises:** `ValueError` naming the leaf, its shape and the rule when a spec has
    more entries than the array's rank, names an axis that is not in the mesh, or
    splits a dimension that the axis size does not divide.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = boxwood.make_mesh((1,), ("data",))
    >>> tree = boxwood.shard({"w": jnp.ones((4, 2))}, mesh, [("w", P("data"))])
    >>> tree["w"].sharding.spec
    P('data',)
    """
    leaves, treedef, placements = resolve(tree, mesh, rules)
    out = [
        leaf if p is None else put(leaf, NamedSharding(mesh, p.spec))
        for leaf, p in zip(leaves, placements)
    ]
    return jtu.tree_unflatten(treedef, out)


def put(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """`x` placed with `sharding`, also when the sharding spans devices of other
    processes (each process then fills its own shards from its copy of `x`, which
    must be the same on every process)."""
    if isinstance(x, jax.Array) and getattr(x, "sharding", None) == sharding:
        return x
    if sharding.is_fully_addressable or (
        isinstance(x, jax.Array) and not x.is_fully_addressable
    ):
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])


def shard_batch(batch: Any, mesh: jax.sharding.Mesh, axis: Any = "data") -> Any:
    """Split the leading (batch) dimension of every array in `batch` over the mesh
    axis `axis`; the other dimensions are replicated.

    In a run of several processes, `batch` is the global batch, the same on every
    process; each process keeps only the rows that its devices hold.

    **Arguments:**

    - `batch`: an array or any pytree of arrays with a common leading dimension.
    - `mesh`: a `jax.sharding.Mesh`.
    - `axis`: the mesh axis (or a tuple of axes) that splits the batch. Defaults
        to `"data"`.

    **Returns:** `batch` with each array sharded as `PartitionSpec(axis)`.

    **Raises:** `ValueError` naming the leaf when its leading dimension is not
    divisible by the axis size, or `axis` is not in the mesh.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> mesh = boxwood.make_mesh((1,), ("data",))
    >>> boxwood.shard_batch(jnp.ones((6, 3)), mesh).sharding.spec
    P('data',)
    """
    sizes = mesh_axis_sizes(mesh)
    axes = entry_axes(axis)
    missing = [a for a in axes if a not in sizes]
    if missing or not axes:
        raise ValueError(
            f"`axis={axis!r}` is not an axis of the mesh, whose axes are "
            f"{tuple(sizes)}; pass `axis=` one of them."
        )
    parts = math.prod(sizes[a] for a in axes)
    flat, treedef = jtu.tree_flatten_with_path(batch)
    for key_path, leaf in flat:
        if is_array(leaf):
            _check_batch_leaf(dotted_path(key_path), leaf, axis, parts)
    sharding = NamedSharding(mesh, PartitionSpec(axis))
    out = [put(leaf, sharding) if is_array(leaf) else leaf for _, leaf in flat]
    return jtu.tree_unflatten(treedef, out)


def _check_batch_leaf(path: str, leaf: Any, axis: Any, parts: int) -> None:
    name = f"batch.{path}" if path else "batch"
    shape = tuple(np.shape(leaf))
    if not shape:
        raise ValueError(
            f"`{name}` is a scalar (shape ()); `shard_batch` splits the leading "
            "dimension, so every array needs one. Pass scalars separately."
        )
    if shape[0] % parts:
        raise ValueError(
            f"`{name}` of shape {shape}: the batch size {shape[0]} is not divisible "
            f"by {parts}, the size of mesh axis {axis!r}. Use a batch size that is a "
            f"multiple of {parts} (e.g. {shape[0] - shape[0] % parts or parts}), or "
            "drop the last partial batch."
        )


def filter_shard(x: Any, device_or_shardings: Any) -> Any:
    """Place the arrays of `x` with `device_or_shardings`: a sharding constraint
    (`jax.lax.with_sharding_constraint`) under a transformation, `jax.device_put`
    outside. Other leaves pass through unchanged. Same as `equinox.filter_shard`.

    **Arguments:**

    - `x`: any pytree.
    - `device_or_shardings`: a `jax.Device`, or a sharding, or a tree of shardings
        that is a prefix of `x` (such as `named_shardings(x, mesh, rules)`).

    **Returns:** `x`, with its arrays sharded accordingly.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> device = jax.devices()[0]
    >>> out = boxwood.filter_shard({"w": jnp.ones(2), "name": "w"}, device)
    >>> out["name"], out["w"].devices() == {device}
    ('w', True)
    """
    target = device_or_shardings
    if isinstance(target, jax.Device):
        target = jax.sharding.SingleDeviceSharding(target)
    leaves, treedef = jtu.tree_flatten(x)
    arrays = [leaf if is_array(leaf) else None for leaf in leaves]
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        move = jax.lax.with_sharding_constraint
    else:
        move = jax.device_put
    # `None` marks the other leaves, so a tree of shardings with `None` there
    # (from `named_shardings`) lines up with the arrays
    placed = treedef.flatten_up_to(move(treedef.unflatten(arrays), target))
    return treedef.unflatten(
        [p if a is not None else leaf for leaf, a, p in zip(leaves, arrays, placed)]
    )
