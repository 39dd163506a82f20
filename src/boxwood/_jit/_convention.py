"""The inner function's calling convention: how `filter_jit` calls the `jax.jit` it
builds for each entry. This file is its one definition; the C fast path is handed
the parts (`fun_dyn`, `split_first`) by `_wrapper.py` and follows them.

- `PLAIN`: `inner(dyn)`, the arguments' arrays in flatten order.
- `WITH_FUN`: `inner(fun_dyn, dyn)`: first the function's own arrays (the module of
  a bound method, `filter_jit(model)`), donated with the arguments' (as in Equinox).
- `SPLIT_FIRST`: `inner(fun_dyn, first, rest)`: the arrays of the first argument
  apart, so that `donate="all-except-first"` donates `fun_dyn` and `rest` only.
"""

from __future__ import annotations

from typing import Any

PLAIN, WITH_FUN, SPLIT_FIRST = "plain", "with_fun", "split_first"


def convention(has_fun_dyn: bool, except_first: bool) -> str:
    """The convention of a wrapper (fixed when it is created)."""
    if except_first:
        return SPLIT_FIRST
    return WITH_FUN if has_fun_dyn else PLAIN


def donate_argnums(conv: str) -> tuple[int, ...]:
    """The positional arguments of the inner function that donation covers."""
    return {PLAIN: (0,), WITH_FUN: (0, 1), SPLIT_FIRST: (0, 2)}[conv]


def call(conv: str, jitted: Any, fun_dyn: list, dyn: list, n_first: int) -> Any:
    """Call the inner `jax.jit` (`n_first`: the first argument's array count)."""
    if conv == PLAIN:
        return jitted(dyn)
    if conv == WITH_FUN:
        return jitted(fun_dyn, dyn)
    return jitted(fun_dyn, dyn[:n_first], dyn[n_first:])


def unpack(conv: str, groups: tuple) -> tuple[Any, list]:
    """Inside the inner function: `(fun_dyn, dyn)` from its positional arguments."""
    if conv == PLAIN:
        return (), groups[0]
    if conv == WITH_FUN:
        return groups[0], groups[1]
    return groups[0], [*groups[1], *groups[2]]


def position(conv: str, group: int, index: int, n_first: int) -> tuple[bool, int]:
    """Where `groups[group][index]` of the inner function's arguments comes from:
    `(True, i)` for `fun_dyn[i]`, `(False, i)` for `dyn[i]`."""
    if conv == PLAIN:
        return False, index
    if group == 0:
        return True, index
    if conv == WITH_FUN or group == 1:
        return False, index
    return False, n_first + index
