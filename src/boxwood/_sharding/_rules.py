"""Sharding rules: `(pattern, spec)` pairs matched against dotted key paths.

A pattern is a Python regular expression matched with `re.fullmatch` against a
leaf's dotted path (`encoder.layers.3.weight`, from `boxwood._paths`). A spec is a
`jax.sharding.PartitionSpec`, `None` (replicated) or a callable
`spec(shape, mesh) -> PartitionSpec | None` (how the strategies decide per shape).
The first matching rule wins; a leaf that no rule matches is replicated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import jax
import jax.tree_util as jtu
from jax.sharding import PartitionSpec

from .._filters import is_array
from .._paths import dotted_path

Spec = PartitionSpec | None | Callable[[tuple, Any], PartitionSpec | None]

MSG_RULES = (
    "`rules` must be a sequence of `(pattern, spec)` pairs, e.g.\n"
    '    [(r".*\\.weight", PartitionSpec("model", None)), (r".*", PartitionSpec())]\n'
    "where `pattern` is a regular expression matched with `re.fullmatch` against "
    "each leaf's dotted path and `spec` is a `PartitionSpec`, `None` (replicated) "
    "or a callable `(shape, mesh) -> PartitionSpec`."
)


class Rule(NamedTuple):
    """One checked rule: its position in `rules`, its source text, its compiled
    pattern and its spec."""

    index: int
    pattern: re.Pattern
    spec: Spec

    def describe(self) -> str:
        return (
            f"rules[{self.index}] = ({self.pattern.pattern!r}, {_spec_text(self.spec)})"
        )


class Placement(NamedTuple):
    """Where one array leaf goes: its dotted path, shape, dtype, the spec chosen and
    the rule that chose it (`None`: no rule matched; replicated)."""

    path: str
    shape: tuple
    dtype: Any
    spec: PartitionSpec
    rule: Rule | None


def _spec_text(spec: Any) -> str:
    if spec is None or isinstance(spec, PartitionSpec):
        return repr(spec)
    return getattr(spec, "__name__", None) or repr(spec)


def check_rules(rules: Any) -> list[Rule]:
    """`rules` as a list of `Rule`s; a clear error for anything malformed."""
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
        raise TypeError(f"{MSG_RULES}\nGot {type(rules).__name__}: {rules!r}.")
    checked = []
    for i, rule in enumerate(rules):
        if not (isinstance(rule, tuple) and len(rule) == 2):
            raise TypeError(f"`rules[{i}]` is {rule!r}, not a pair.\n{MSG_RULES}")
        pattern, spec = rule
        checked.append(Rule(i, _compile(pattern, i), _check_spec(spec, i)))
    return checked


def _compile(pattern: Any, i: int) -> re.Pattern:
    if isinstance(pattern, re.Pattern):
        return pattern
    if not isinstance(pattern, str):
        raise TypeError(
            f"`rules[{i}]`: the pattern must be a string (a regular expression), "
            f"got {pattern!r}.\n{MSG_RULES}"
        )
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(
            f"`rules[{i}]`: {pattern!r} is not a valid regular expression ({error}). "
            "Patterns are Python regular expressions matched with `re.fullmatch`; "
            r"escape literal dots as `\.` or use `re.escape`."
        ) from None


def _check_spec(spec: Any, i: int) -> Spec:
    if spec is None or isinstance(spec, PartitionSpec) or callable(spec):
        return cast(Spec, spec)
    raise TypeError(
        f"`rules[{i}]`: the spec must be a `jax.sharding.PartitionSpec`, `None` or a "
        f"callable, got {spec!r}. Write `PartitionSpec({spec!r})` for one axis."
    )


def mesh_axis_sizes(mesh: Any) -> dict[str, int]:
    """`{axis name: size}` of a `Mesh` or `AbstractMesh`."""
    shape = getattr(mesh, "shape", None)
    if not hasattr(mesh, "axis_names") or shape is None:
        raise TypeError(
            f"`mesh` must be a `jax.sharding.Mesh` (or `AbstractMesh`), got "
            f"{type(mesh).__name__}. Build one with "
            '`boxwood.make_mesh((8,), ("data",))`.'
        )
    return dict(shape)


def entry_axes(entry: Any) -> tuple:
    """The mesh axes of one entry of a `PartitionSpec` (`None`, a name, a tuple)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def spec_problem(spec: PartitionSpec, shape: tuple, sizes: dict) -> str | None:
    """Why `spec` cannot split an array of `shape` on a mesh of axis `sizes`, or
    `None` if it can."""
    if len(spec) > len(shape):
        return (
            f"the spec has {len(spec)} entries but the array has rank {len(shape)}; "
            f"give at most {len(shape)} entries"
        )
    seen: set = set()
    for dim, entry in enumerate(spec):
        axes = entry_axes(entry)
        for axis in axes:
            if axis not in sizes:
                return (
                    f"mesh axis {axis!r} is not in the mesh, whose axes are "
                    f"{tuple(sizes)}"
                )
            if axis in seen:
                return f"mesh axis {axis!r} is used twice; each axis splits one dim"
            seen.add(axis)
        parts = math.prod(sizes[a] for a in axes)
        if shape[dim] % parts:
            return (
                f"dimension {dim} (size {shape[dim]}) is not divisible by {parts}, "
                f"the size of mesh axes {axes}; pick a dimension or a mesh axis "
                "that divides it, or replicate this leaf with an earlier rule"
            )
    return None


def _leaf_spec(rule: Rule, shape: tuple, mesh: Any) -> PartitionSpec:
    spec = rule.spec
    if callable(spec) and not isinstance(spec, PartitionSpec):
        spec = spec(shape, mesh)
    if spec is None:
        return PartitionSpec()
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"it returned {spec!r}, not a PartitionSpec or None")
    return spec


def _is_placeable(leaf: Any) -> bool:
    return is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def resolve(tree: Any, mesh: Any, rules: Any) -> tuple[list, Any, list]:
    """Match every array leaf of `tree` with its rule and check the spec fits.

    **Returns:** `(leaves, treedef, placements)` where `placements[i]` is a
    `Placement` for array leaves and `None` for other leaves.
    """
    checked = check_rules(rules)
    sizes = mesh_axis_sizes(mesh)
    flat, treedef = jtu.tree_flatten_with_path(tree)
    placements = []
    for key_path, leaf in flat:
        if not _is_placeable(leaf):
            placements.append(None)
            continue
        placements.append(
            _place_leaf(dotted_path(key_path), leaf, checked, mesh, sizes)
        )
    return [leaf for _, leaf in flat], treedef, placements


def _place_leaf(path: str, leaf: Any, rules: list, mesh: Any, sizes: dict) -> Placement:
    shape = tuple(leaf.shape)
    rule = next((r for r in rules if r.pattern.fullmatch(path)), None)
    if rule is None:
        return Placement(path, shape, leaf.dtype, PartitionSpec(), None)
    try:
        spec = _leaf_spec(rule, shape, mesh)
        problem = spec_problem(spec, shape, sizes)
    except (TypeError, ValueError) as error:
        problem, spec = str(error), None
    if problem is not None:
        raise ValueError(
            f"Sharding rule {rule.describe()} does not fit leaf `{path or '<root>'}` "
            f"of shape {shape}"
            + (f" (spec {spec})" if spec is not None else "")
            + f": {problem}."
        )
    assert spec is not None  # no problem: `_leaf_spec` returned a spec
    return Placement(path, shape, leaf.dtype, spec, rule)
