"""Ready-made rules: data parallel, fully sharded data parallel (FSDP), and tensor
parallel for `Linear`, `MLP` and `MultiheadAttention`.

Each strategy returns a list of `(pattern, spec)` rules; lists concatenate (the
first matching rule wins), e.g. `tensor_parallel(model) + fsdp()`. The patterns
match a parameter's path also when it sits deeper in a larger tree, so the same
rules shard an optimiser state (`0.mu.layers.0.weight`) like the model.
"""

from __future__ import annotations

import re
from typing import Any

import jax.tree_util as jtu
from jax.sharding import PartitionSpec

from .._paths import dotted_path
from ._rules import mesh_axis_sizes


def data_parallel() -> list:
    """Rules that replicate every parameter: data parallelism, where only the batch
    is split (with `shard_batch`).

    **Returns:** `[(".*", PartitionSpec())]`.

    >>> import boxwood
    >>> boxwood.data_parallel()
    [('.*', P())]
    """
    return [(".*", PartitionSpec())]


class _LargestDivisibleDim:
    """The FSDP spec: split the largest dimension that the axis size divides."""

    def __init__(self, axis: str, min_size: int):
        self.axis = axis
        self.min_size = min_size

    def __repr__(self) -> str:
        return f"fsdp(axis={self.axis!r}, min_size={self.min_size})"

    def __call__(self, shape: tuple, mesh: Any) -> PartitionSpec:
        sizes = mesh_axis_sizes(mesh)
        if self.axis not in sizes:
            raise ValueError(
                f"mesh axis {self.axis!r} is not in the mesh, whose axes are "
                f"{tuple(sizes)}; pass `fsdp(axis=...)` one of them"
            )
        n = sizes[self.axis]
        size = 1
        for d in shape:
            size *= d
        if size < self.min_size:
            return PartitionSpec()
        dims = [i for i, d in enumerate(shape) if d % n == 0 and d >= n]
        if not dims:
            return PartitionSpec()
        best = max(dims, key=lambda i: (shape[i], -i))
        return PartitionSpec(*([None] * best), self.axis)


def fsdp(axis: str = "data", min_size: int = 1024) -> list:
    """Rules for fully sharded data parallelism: each array's largest dimension that
    the size of mesh axis `axis` divides is split over that axis (the earliest such
    dimension on a tie); arrays with fewer than `min_size` elements, or with no such
    dimension, are replicated. The batch is split over the same axis with
    `shard_batch`.

    **Arguments:**

    - `axis`: the mesh axis (default `"data"`).
    - `min_size`: arrays with fewer elements are replicated (default 1024).

    **Returns:** `[(".*", spec)]`, with `spec` deciding per shape.

    >>> import boxwood
    >>> from jax.sharding import AbstractMesh
    >>> [(pattern, spec)] = boxwood.fsdp(min_size=16)
    >>> spec((3, 64, 32), AbstractMesh((8,), ("data",)))
    P(None, 'data')
    >>> spec((4, 2), AbstractMesh((8,), ("data",)))
    P()
    """
    return [(".*", _LargestDivisibleDim(axis, min_size))]


def tensor_parallel(model: Any, axis: str = "model") -> list:
    """Megatron-style tensor-parallel rules for every `Linear`, `MLP` and
    `MultiheadAttention` in `model`.

    - An `MLP`'s layers alternate column-parallel (weight `(out, in)` split on
        `out`, bias split) and row-parallel (weight split on `in`, bias
        replicated), so each pair needs a single collective.
    - A `MultiheadAttention`'s query, key and value projections are
        column-parallel (heads split) and its output projection row-parallel.
    - Any other `Linear` is column-parallel.
    - Stacked layers (`MLP(scan=True)`) keep their leading axis unsplit.

    Other leaves are not covered: append more rules (e.g. `+ fsdp()`) or leave them
    replicated.

    **Arguments:**

    - `model`: the model (only its structure and array ranks are read).
    - `axis`: the mesh axis that splits the layers (default `"model"`).

    **Returns:** a list of `(pattern, PartitionSpec)` rules.

    >>> import boxwood, jax
    >>> mlp = boxwood.nn.MLP(4, 4, 8, depth=1, key=jax.random.key(0))
    >>> for pattern, spec in boxwood.tensor_parallel(mlp):
    ...     print(pattern, spec)
    (?:.*\\.)?layers\\.0\\.weight P('model', None)
    (?:.*\\.)?layers\\.0\\.bias P('model',)
    (?:.*\\.)?layers\\.1\\.weight P(None, 'model')
    (?:.*\\.)?layers\\.1\\.bias P()
    """
    from ..nn import MLP, Linear, MultiheadAttention

    kinds = (Linear, MLP, MultiheadAttention)
    found = jtu.tree_flatten_with_path(model, is_leaf=lambda x: isinstance(x, kinds))
    rules: list = []
    for key_path, node in found[0]:
        prefix = dotted_path(key_path)
        if isinstance(node, MLP):
            for i, layer in enumerate(node.layers):
                rules += _linear(_join(prefix, f"layers.{i}"), layer, axis, i % 2 == 0)
        elif isinstance(node, MultiheadAttention):
            for name in ("query_proj", "key_proj", "value_proj"):
                rules += _linear(_join(prefix, name), getattr(node, name), axis, True)
            rules += _linear(
                _join(prefix, "output_proj"), node.output_proj, axis, False
            )
        elif isinstance(node, Linear):
            rules += _linear(prefix, node, axis, True)
    return rules


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _pattern(path: str) -> str:
    return r"(?:.*\.)?" + re.escape(path)


def _linear(prefix: str, linear: Any, axis: str, column: bool) -> list:
    lead = (None,) * (linear.weight.ndim - 2)  # stacked layers: leading axis kept
    if column:
        weight, bias = PartitionSpec(*lead, axis, None), PartitionSpec(*lead, axis)
    else:
        weight, bias = PartitionSpec(*lead, None, axis), PartitionSpec()
    rules = [(_pattern(_join(prefix, "weight")), weight)]
    if linear.bias is not None:
        rules.append((_pattern(_join(prefix, "bias")), bias))
    return rules
