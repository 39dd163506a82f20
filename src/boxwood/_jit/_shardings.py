"""`filter_jit(in_shardings=..., out_shardings=...)`: shardings given as pytree
prefixes of the arguments and of the output, translated for the inner `jax.jit`,
which sees flat lists of arrays.

- `in_shardings` is a prefix of the positional-argument tuple `args`; it is
  broadcast over the leaves of `args` and picked at the plan's dynamic leaves, so
  the inner `jax.jit` gets one sharding per array (`None`, JAX's "unspecified", for
  keyword arguments and a bound method's module).
- `out_shardings` is a prefix of the output; it is applied where the output is
  made, as a sharding constraint on each array of the output (the output's
  structure is only known once traced). Inputs and outputs placed alike let
  donated buffers be reused step after step.

Each leaf of either tree is a `jax.sharding.Sharding`, a `jax.Device` or `None`
(unspecified).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu
from jax.sharding import Sharding

from .._filters import is_array
from . import _convention

SHARDING_KWARGS = ("in_shardings", "out_shardings")


def _is_leaf(x: Any) -> bool:
    return x is None or isinstance(x, (Sharding, jax.Device))


def _as_sharding(x: Any) -> Sharding | None:
    if isinstance(x, jax.Device):
        return jax.sharding.SingleDeviceSharding(x)
    return x


def check(name: str, tree: Any) -> None:
    """A clear error if `tree` (the value of option `name`) holds anything but
    shardings, devices and `None`."""
    for path, leaf in jtu.tree_flatten_with_path(tree, is_leaf=_is_leaf)[0]:
        if not _is_leaf(leaf):
            where = f"{name}{jtu.keystr(path)}"
            raise TypeError(
                f"`filter_jit({name}=...)`: `{where}` is {leaf!r}; each leaf must be "
                "a `jax.sharding.Sharding` (e.g. `NamedSharding(mesh, P('data'))`), a "
                "`jax.Device` or `None` (unspecified). `boxwood.named_shardings` "
                "builds such a tree for a model."
            )


def broadcast(name: str, prefix: Any, tree: Any) -> list:
    """One sharding (or `None`) per leaf of `tree`, from the pytree `prefix`."""
    prefix_def = jtu.tree_structure(prefix, is_leaf=_is_leaf)
    try:
        subtrees = prefix_def.flatten_up_to(tree)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"`filter_jit({name}=...)` must be a pytree prefix of the "
            f"{'positional arguments (a tuple, one entry per argument)' if name == 'in_shardings' else 'output'}"
            f", or a single sharding for all of them: {error}"
        ) from None
    out: list = []
    for sharding, sub in zip(jtu.tree_leaves(prefix, is_leaf=_is_leaf), subtrees):
        out += [_as_sharding(sharding)] * len(jtu.tree_leaves(sub))
    return out


def in_shardings(prefix: Any, plan: Any, conv: str, hidden: bool = False) -> tuple:
    """`jax.jit`'s `in_shardings` for the inner function of `plan`, whose positional
    arguments follow the calling convention `conv` (`_convention.py`). With `hidden`,
    `args[0]` is the tuple of captured values (`_capture/`): unspecified."""
    placeholders = plan.treedef.unflatten(range(plan.n))  # leaf i -> i
    args = placeholders[0] if plan.kw else placeholders
    if hidden:
        args = tuple(args)[1:]
    per_leaf: list = [None] * plan.n
    arg_leaves = jtu.tree_leaves(args)
    for i, sharding in zip(arg_leaves, broadcast("in_shardings", prefix, args)):
        per_leaf[i] = sharding
    dyn = [per_leaf[i] for i in plan.dyn_idx]
    if conv == _convention.SPLIT_FIRST:  # the function's own arrays: unspecified
        return (None, dyn[: plan.n_first], dyn[plan.n_first :])
    return (None, dyn) if conv == _convention.WITH_FUN else (dyn,)


def constrain_output(prefix: Any, out: Any) -> Any:
    """`out` with each array constrained to its sharding from `prefix`."""
    leaves, treedef = jtu.tree_flatten(out)
    shardings = broadcast("out_shardings", prefix, out)
    leaves = [
        jax.lax.with_sharding_constraint(x, s) if s is not None and is_array(x) else x
        for x, s in zip(leaves, shardings)
    ]
    return treedef.unflatten(leaves)
