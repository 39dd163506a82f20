"""Validated assembly: a tree shaped like `like`, filled from named tensors.

Every problem (missing, unexpected, shape, dtype) is collected first and reported
together in one `CheckpointError`; no array is read before validation passed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._error import CheckpointError
from ._format import describe
from ._leaves import Leaf, stored_leaves


class Tensor(Protocol):
    """A named tensor from a file or a state dict, read on demand."""

    dtype: np.dtype
    shape: tuple[int, ...]

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
class _Plan:
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
) -> _Plan | None:
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
        return _Plan(leaf, tensor, want_dtype, reshape)
    line = (
        f"{leaf.name}: {where.removeprefix('the ')} has "
        f"{describe(tensor.dtype, tensor.shape)}, model expects "
        f"{describe(want_dtype, leaf.shape)}"
    )
    if leaf.key_impl is not None:
        line += f" (a PRNG key array of impl {leaf.key_impl!r}, stored as key data)"
    elif shape_ok:
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
    source: str = "the checkpoint",
    where: str = "the file",
    hint: Callable[[], str] | None = None,
) -> tuple[Any, LoadReport]:
    """Fill `like`'s stored leaves from `tensors`, after validating all of them.

    **Arguments:**

    - `like`: the tree whose structure, shapes, dtypes and shardings to produce.
    - `tensors`: the source, by dotted name.
    - `strict`: whether missing and unexpected names are errors.
    - `cast`: a floating dtype to cast floating-point arrays to, or `None`.
    - `squeeze_ok`: whether a tensor may differ from the leaf by size-1 axes.
    - `source`: how the error's first line names the source; `where`: how each
      problem's line does.
    - `hint`: called to add a line to the error (e.g. a fingerprint mismatch).

    **Returns:** `(tree, report)`.
    """
    leaves, pairs, treedef = stored_leaves(like)
    names = {leaf.name for leaf in leaves}
    report = LoadReport(
        [leaf.name for leaf in leaves if leaf.name not in tensors],
        [name for name in tensors if name not in names],
    )
    problems: list[str] = []
    if strict:
        problems += [f"{n}: missing from {where}" for n in report.missing_keys]
        problems += [f"{n}: in {where} but not in the model" for n in report.unexpected_keys]
    else:
        problems += [
            f"{leaf.name}: missing from {where}, and `like` has no value to keep "
            "(it is abstract)"
            for leaf in leaves
            if leaf.name not in tensors and isinstance(leaf.value, jax.ShapeDtypeStruct)
        ]
    plans = {}
    for leaf in leaves:
        if leaf.name in tensors:
            plan = _plan_one(
                leaf, tensors[leaf.name], cast, squeeze_ok, where, problems
            )
            plans[leaf.name] = plan
    if problems:
        raise _error(problems, source, hint)
    loaded = {name: _materialise(plan) for name, plan in plans.items()}
    it = iter(leaves)
    out = []
    for _, x in pairs:
        if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
            name = next(it).name
            out.append(loaded.get(name, x))
        else:
            out.append(x)
    return jtu.tree_unflatten(treedef, out), report


def _error(problems: list[str], source: str, hint: Callable[[], str] | None) -> Exception:
    count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
    text = f"Cannot load {source} into the given tree ({count}):\n"
    text += "\n".join(f"  - {p}" for p in problems)
    extra = hint() if hint is not None else ""
    if extra:
        text += "\n" + extra
    return CheckpointError(text, problems)


def _sharding(x: Any) -> Any:
    if isinstance(x, jax.Array):
        return x.sharding
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.sharding
    return None


def _materialise(plan: _Plan) -> Any:
    leaf, tensor = plan.leaf, plan.tensor
    like = leaf.value

    def host(index: tuple[slice, ...] | None = None) -> np.ndarray:
        if plan.reshape:
            data = tensor.read().reshape(leaf.shape)
            data = data if index is None else data[index]
        else:
            data = tensor.read(index)
        if data.dtype != plan.dtype:
            data = data.astype(plan.dtype)
        return data

    if isinstance(like, np.ndarray):
        return host()
    if isinstance(like, np.generic):
        return host()[()]
    if leaf.key_impl is not None:
        keys = jax.random.wrap_key_data(jnp.asarray(host()), impl=leaf.key_impl)
        sharding = _sharding(like)
        return keys if sharding is None else jax.device_put(keys, sharding)
    sharding = _sharding(like)
    if sharding is None or sharding.is_fully_addressable and len(sharding.device_set) == 1:
        return jax.device_put(host(), sharding)
    # Each device's shard is read from the file on its own: a sharded model is
    # never gathered whole in host memory.
    return jax.make_array_from_callback(leaf.shape, sharding, host)
