"""`sharding_plan`: where each leaf would go and what it costs per device, without
moving any data."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ._rules import Placement, entry_axes, mesh_axis_sizes, resolve


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One array leaf of a `ShardingPlan`."""

    path: str
    shape: tuple
    dtype: Any
    spec: Any
    rule: str
    shard_shape: tuple
    bytes_total: int
    bytes_per_device: int


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """The leaf-by-leaf result of `sharding_plan`; `str(plan)` is a table.

    **Fields:** `rows` (a `PlanRow` per array leaf: dotted path, shape, dtype, spec,
    the rule that chose it, the shape of one shard, bytes in total and bytes per
    device), `mesh_shape` (`{axis: size}`), `unused_rules` (the indices of rules
    that matched no leaf: often a typo in a pattern).
    """

    rows: tuple
    mesh_shape: dict
    unused_rules: tuple

    @property
    def bytes_total(self) -> int:
        """Bytes of every array leaf, counted once."""
        return sum(r.bytes_total for r in self.rows)

    @property
    def bytes_per_device(self) -> int:
        """Bytes each device holds (every device holds the same amount)."""
        return sum(r.bytes_per_device for r in self.rows)

    def __str__(self) -> str:
        head = ("leaf", "shape", "dtype", "spec", "per device", "bytes/device", "rule")
        body = [
            (
                r.path or "<root>",
                str(r.shape),
                str(np.dtype(r.dtype)),
                _spec_str(r.spec),
                str(r.shard_shape),
                _bytes(r.bytes_per_device),
                r.rule,
            )
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                 for row in [head, *body]]  # fmt: skip
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh_shape.items())
        lines.append(
            f"total: {_bytes(self.bytes_total)}; per device: "
            f"{_bytes(self.bytes_per_device)} (mesh {mesh})"
        )
        if self.unused_rules:
            lines.append(f"rules that matched no leaf: {list(self.unused_rules)}")
        return "\n".join(lines)


def _spec_str(spec: Any) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")" if len(spec) else "replicated"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def _row(p: Placement, sizes: dict) -> PlanRow:
    parts = [math.prod(sizes[a] for a in entry_axes(e)) for e in p.spec]
    parts += [1] * (len(p.shape) - len(parts))
    shard = tuple(d // k for d, k in zip(p.shape, parts))
    item = np.dtype(p.dtype).itemsize
    rule = (
        "-" if p.rule is None else f"rules[{p.rule.index}] {p.rule.pattern.pattern!r}"
    )
    return PlanRow(
        p.path, p.shape, p.dtype, p.spec, rule, shard,
        math.prod(p.shape) * item, math.prod(shard) * item,
    )  # fmt: skip


def sharding_plan(tree: Any, mesh: Any, rules: Any = (), *, show: bool = True):
    """The leaf-by-leaf plan of `shard(tree, mesh, rules)`, without moving data.

    Works on abstract trees too (leaves `jax.ShapeDtypeStruct`, e.g. from
    `boxwood.filter_eval_shape`), and on a `jax.sharding.AbstractMesh`, so a model
    too large for one device can be planned before it is built.

    **Arguments:**

    - `tree`: any pytree; array leaves (and `ShapeDtypeStruct`s) are planned.
    - `mesh`: a `jax.sharding.Mesh` or `AbstractMesh`.
    - `rules`: `(pattern, spec)` pairs; see `shard`.
    - `show`: print the plan (default `True`). (Keyword only.)

    **Returns:** a `ShardingPlan`; `str(plan)` is the printed table.

    **Raises:** the same errors as `shard`.

    >>> import boxwood, jax, numpy as np
    >>> from jax.sharding import AbstractMesh, PartitionSpec as P
    >>> mesh = AbstractMesh((4,), ("data",))
    >>> tree = {"w": jax.ShapeDtypeStruct((8, 2), np.float32), "b": np.zeros(2)}
    >>> plan = boxwood.sharding_plan(tree, mesh, [("w", P("data"))])
    leaf  shape   dtype    spec        per device  bytes/device  rule
    b     (2,)    float64  replicated  (2,)        16 B          -
    w     (8, 2)  float32  P('data')   (2, 2)      16 B          rules[0] 'w'
    total: 80 B; per device: 32 B (mesh data=4)
    >>> plan.bytes_per_device
    32
    """
    _, _, placements = resolve(tree, mesh, rules)
    sizes = mesh_axis_sizes(mesh)
    placed = [p for p in placements if p is not None]
    used = {p.rule.index for p in placed if p.rule is not None}
    n_rules = len(rules)
    plan = ShardingPlan(
        rows=tuple(_row(p, sizes) for p in placed),
        mesh_shape=sizes,
        unused_rules=tuple(i for i in range(n_rules) if i not in used),
    )
    if show:
        print(plan)
    return plan
