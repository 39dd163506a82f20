"""Validated assembly: a tree shaped like `like`, filled from named tensors.

Every problem (missing, unexpected, shape, dtype) is collected first and reported
together in one `CheckpointError`; no array is read before validation passed. A
leaf stored as one tensor per layer (`parts`) is validated part by part in the
same pass, then read once (`_parts`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._error import CheckpointError
from ._format import describe
from ._host_memory import aligned_empty
from ._leaves import Leaf, is_stored, stored_leaves
from ._load_progress import load_progress
from ._parts import Part, PartsTensor
from ._safetensors import read_region


class Tensor(Protocol):
    """A named tensor from a file or a state dict, read on demand."""

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray: ...


@dataclass
class LoadReport:
    """What a non-strict load could not match.

    **Fields:** `missing_keys`: names the tree has and the source lacks (those
    leaves keep their value from the tree); `unexpected_keys`: names the source
    has and the tree lacks (ignored).
    """

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """A validated leaf: where its value comes from and the dtype it will have."""

    leaf: Leaf
    tensor: Tensor
    dtype: np.dtype  # what the loaded array's dtype will be
    reshape: bool


def _is_float(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _plan_one(
    leaf: Leaf,
    tensor: Tensor,
    cast: Any,
    squeeze_ok: bool,
    where: str,
    problems: list[str],
) -> Plan | None:
    want_dtype = leaf.dtype
    if cast is not None and leaf.key_impl is None and _is_float(want_dtype):
        want_dtype = np.dtype(cast)
    shape_ok = tuple(tensor.shape) == leaf.shape
    reshape = False
    if not shape_ok and squeeze_ok:
        same_data = [d for d in tensor.shape if d != 1] == [
            d for d in leaf.shape if d != 1
        ]
        reshape = shape_ok = same_data
    dtype_ok = tensor.dtype == want_dtype or (
        cast is not None and _is_float(tensor.dtype) and _is_float(want_dtype)
    )
    if shape_ok and dtype_ok:
        return Plan(leaf, tensor, want_dtype, reshape)
    line = (
        f"{leaf.name}: {where.removeprefix('the ')} has "
        f"{describe(tensor.dtype, tensor.shape)}, model expects "
        f"{describe(want_dtype, leaf.shape)}"
    )
    if leaf.key_impl is not None:
        line += f" (a PRNG key array of impl {leaf.key_impl!r}, stored as key data)"
    elif shape_ok and _is_float(tensor.dtype) and _is_float(want_dtype):
        line += " (pass `dtype=` to cast floating-point arrays explicitly)"
    problems.append(line)
    return None


def assemble(
    like: Any,
    tensors: Mapping[str, Tensor],
    *,
    strict: bool,
    cast: Any = None,
    squeeze_ok: bool = False,
    parts: Mapping[str, Part] | None = None,
    source: str = "the checkpoint",
    where: str = "the file",
    hint: Callable[[LoadReport], str] | None = None,
    materialise: Callable[[list[Plan]], dict[str, Any]] | None = None,
    progress: bool = False,
    region: bool = False,
) -> tuple[Any, LoadReport]:
    """Fill `like`'s stored leaves from `tensors`, after validating all of them.

    **Arguments:**

    - `like`: the tree whose structure, shapes, dtypes and shardings to produce.
    - `tensors`: the source, by dotted name.
    - `strict`: whether missing and unexpected names are errors.
    - `cast`: a floating dtype to cast floating-point arrays to, or `None`.
    - `squeeze_ok`: whether a tensor may differ from the leaf by size-1 axes.
    - `parts`: the names the source has for `like`'s leaves, where they are not
      the leaves' own: `{tensor name: Part(leaf name, index)}`, in the order
      problems are listed. A leaf named by parts with an `index` is read from
      them, each one validated as the leaf's row at `index`, into one buffer
      (`_parts.PartsTensor`). Default: each leaf whole, under its own name.
    - `source`: how the error's first line names the source; `where`: how each
      problem's line does.
    - `hint`: called with the report to add a line to the error.
    - `materialise`: reads the validated plans all at once, giving each leaf's new
      value by name (orbax restores in one call); default: one by one.
    - `progress`: whether a large load may show a progress bar (`_load_progress`;
      default `materialise` only).
    - `region`: whether the reads that copy take their buffers from one region
      of memory sized for all of them, whose pages a helper thread faults in
      meanwhile (`read_region`; default `materialise` only, unsharded leaves:
      the region lives until the last array holding a piece of it is freed).

    **Returns:** `(tree, report)`.
    """
    leaves, pairs, treedef = stored_leaves(like)
    wanted = _wanted(leaves, parts)
    report, problems = _check_names(wanted, tensors, strict, where)
    planned = {}
    for want in wanted:
        if want.view.name in tensors:
            tensor = tensors[want.view.name]
            plan = _plan_one(want.view, tensor, cast, squeeze_ok, where, problems)
            planned[want.view.name] = plan
    plans = _leaf_plans(leaves, wanted, planned, problems)
    if problems:
        raise _error(problems, source, hint(report) if hint else "")
    if materialise is None:
        reads = [plan.tensor for plan in plans]
        with read_region(reads, cast) if region else contextlib.nullcontext():
            loaded = _materialise_all(plans, progress)
    else:
        loaded = materialise(plans)
    names = iter(leaf.name for leaf in leaves)
    out = [loaded.get(next(names), x) if is_stored(x) else x for _, x in pairs]
    return jtu.tree_unflatten(treedef, out), report


@dataclass(frozen=True)
class _Want:
    """A tensor the source should hold: `view` (its name, and the shape and dtype
    it must have) is `leaf` itself, or the row `index` of it."""

    view: Leaf
    leaf: Leaf
    index: tuple[int, ...]


def _wanted(leaves: list[Leaf], parts: Mapping[str, Part] | None) -> list[_Want]:
    """The tensors `like`'s leaves are read from: those `parts` names, in its
    order, then every other leaf whole under its own name."""
    by_name = {leaf.name: leaf for leaf in leaves}
    out, covered = [], set()
    for name, (leaf_name, index) in (parts or {}).items():
        leaf = by_name[leaf_name]
        covered.add(leaf_name)
        value = leaf.value
        if index:
            value = jax.ShapeDtypeStruct(value.shape[len(index) :], value.dtype)
        out.append(_Want(Leaf(name, value, leaf.key_impl), leaf, tuple(index)))
    out += [_Want(leaf, leaf, ()) for leaf in leaves if leaf.name not in covered]
    return out


def _leaf_plans(
    leaves: list[Leaf],
    wanted: list[_Want],
    planned: dict[str, Plan | None],
    problems: list[str],
) -> list[Plan]:
    """Each stored leaf's plan, in `leaves`' order: its tensor's, or its parts'
    joined into one `PartsTensor` (a leaf without a tensor keeps its value)."""
    groups: dict[str, list[_Want]] = {}
    for want in wanted:
        groups.setdefault(want.leaf.name, []).append(want)
    plans = []
    for leaf in leaves:
        group = groups[leaf.name]
        found = [planned.get(want.view.name) for want in group]
        if not any(found):
            continue
        if len(group) == 1 and not group[0].index:
            plan = cast(Plan, found[0])
            plans.append(Plan(leaf, plan.tensor, plan.dtype, plan.reshape))
        else:
            plan = _joined(leaf, group, found, problems)
            plans += [plan] if plan is not None else []
    return plans


def _joined(
    leaf: Leaf, group: list[_Want], found: list[Plan | None], problems: list[str]
) -> Plan | None:
    """`leaf` read from the tensors of its rows (`group`, validated as `found`),
    or a problem where the rows named are not each of the leaf's rows once."""
    axes = len(group[0].index)
    lead = tuple(leaf.value.shape[:axes])
    if sorted(want.index for want in group) != list(np.ndindex(*lead)):
        problems.append(
            f"{leaf.name}: the tensors named for it are not one for each index of "
            f"its leading axes {lead}"
        )
        return None
    if problems:  # nothing will be read
        return None
    rows: list[Any] = [None] * len(group)
    for want, plan in zip(group, found):
        row = int(np.ravel_multi_index(want.index, lead))
        rows[row] = plan.tensor if plan is not None else None
    dtype = next(plan.dtype for plan in found if plan is not None)
    keep = None
    if any(row is None for row in rows):  # a non-strict load: keep those rows
        value = leaf.value
        keep = np.asarray(jax.random.key_data(value) if leaf.key_impl else value)
    tensor = PartsTensor(tuple(rows), leaf.shape, dtype, axes, keep)
    return Plan(leaf, tensor, dtype, reshape=False)


def _check_names(
    wanted: list[_Want], tensors: Mapping[str, Tensor], strict: bool, where: str
) -> tuple[LoadReport, list[str]]:
    """The missing and unexpected names, and the problems they make."""
    names = {want.view.name for want in wanted}
    report = LoadReport(
        [want.view.name for want in wanted if want.view.name not in tensors],
        [name for name in tensors if name not in names],
    )
    if strict:
        problems = [f"{n}: missing from {where}" for n in report.missing_keys]
        problems += [
            f"{n}: in {where} but not in the model" for n in report.unexpected_keys
        ]
        return report, problems
    abstract = [
        want.view.name
        for want in wanted
        if want.view.name not in tensors
        and isinstance(want.leaf.value, jax.ShapeDtypeStruct)
    ]
    problems = [
        f"{n}: missing from {where}, and `like` has no value to keep (it is abstract)"
        for n in abstract
    ]
    return report, problems


def _error(problems: list[str], source: str, extra: str) -> Exception:
    count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
    text = f"Cannot load {source} into the given tree ({count}):\n"
    text += "\n".join(f"  - {p}" for p in problems)
    if extra:
        text += "\n" + extra
    return CheckpointError(text, problems)


def sharding_of(x: Any) -> Any:
    if isinstance(x, jax.Array):
        return x.sharding
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.sharding
    return None


def _nbytes(tensor: Tensor) -> int:
    return np.dtype(tensor.dtype).itemsize * int(np.prod(tensor.shape, dtype=np.int64))


def _materialise_all(plans: list[Plan], progress: bool) -> dict[str, Any]:
    total = sum(_nbytes(plan.tensor) for plan in plans)
    loaded = {}
    with load_progress(total, progress) as advance:
        for plan in plans:
            loaded[plan.leaf.name] = _materialise(plan)
            advance(_nbytes(plan.tensor))
    return loaded


def _cast(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`data` as `dtype`, in a new 64-byte aligned array (which the device adopts)."""
    out = aligned_empty(data.shape, dtype)
    np.copyto(out, data, casting="unsafe")
    return out


def _materialise(plan: Plan) -> Any:
    leaf, tensor = plan.leaf, plan.tensor
    like = leaf.value

    def read(index: tuple[slice, ...] | None = None) -> np.ndarray:
        if plan.reshape:
            data = tensor.read().reshape(leaf.shape)
            return data if index is None else data[index]
        return tensor.read(index)

    def host(index: tuple[slice, ...] | None = None) -> np.ndarray:
        data = read(index)
        return data if data.dtype == plan.dtype else _cast(data, plan.dtype)

    if isinstance(like, np.ndarray | np.generic):
        # a NumPy leaf is the caller's to change: never a view of a file's mapping
        data = host()
        data = data if data.flags.writeable else data.copy()
        return data if isinstance(like, np.ndarray) else data[()]
    sharding = sharding_of(like)
    if leaf.key_impl is not None:
        keys = jax.random.wrap_key_data(jnp.asarray(host()), impl=leaf.key_impl)
        return keys if sharding is None else jax.device_put(keys, sharding)
    if sharding is None or (
        sharding.is_fully_addressable and len(sharding.device_set) == 1
    ):
        # A file's tensor is a read-only view of the file's private mapping or a
        # fresh 64-byte aligned buffer that nothing else references, and a cast
        # makes a fresh aligned buffer: the device (on the CPU) adopts such a
        # buffer instead of copying it again (halves a load's time, see
        # benchmarks/bench_checkpoint.py). A state dict's arrays are the caller's:
        # they are copied unless cast.
        data = read()
        owned = getattr(tensor, "reads_are_owned", False)
        if data.dtype != plan.dtype:
            data, owned = _cast(data, plan.dtype), True
        return jax.device_put(data, sharding, may_alias=owned and not plan.reshape)
    # Each device's shard is read from the file on its own: a sharded model is
    # never gathered whole in host memory.
    return jax.make_array_from_callback(leaf.shape, sharding, host)
