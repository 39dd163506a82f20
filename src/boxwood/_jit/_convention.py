"""The inner function's calling convention: how `filter_jit` calls the `jax.jit` it
builds for each entry, and how the core's positional arguments begin (`Leading`:
the hidden first argument of captured values, the first argument kept out of
donation). This file is the one definition of both.

- `PLAIN`: `inner(dyn)`, the arguments' arrays in flatten order.
- `WITH_FUN`: `inner(fun_dyn, dyn)`: first the function's own arrays (the module of
  a bound method, `filter_jit(model)`), donated with the arguments' (as in Equinox).
- `SPLIT_FIRST`: `inner(fun_dyn, first, rest)`: the arrays of the first argument
  apart, so that `donate="all-except-first"` donates `fun_dyn` and `rest` only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

PLAIN, WITH_FUN, SPLIT_FIRST = "plain", "with_fun", "split_first"


class Leading:
    """How a wrapper's positional arguments begin: the one place that knows about
    the hidden first argument.

    - `labels`: with captured values (`_capture/`), `args[0]` is a tuple of them,
      one entry per label, never donated; the user's arguments follow. `None`
      otherwise.
    - `count`: how many leading arguments are kept out of donation (the hidden
      one, and with `donate="...-except-first"` the user's first).
    - `first_name`: with `donate="...-except-first"` and no hidden argument, the
      name of the function's first parameter, so that passing it by keyword keeps
      it out of donation too (it is moved to `args[0]`: `positional`).
    """

    __slots__ = ("labels", "count", "first_name")

    def __init__(self, fun: Any, labels: list[str] | None, except_first: bool) -> None:
        self.labels = labels
        self.count = bool(labels) + except_first
        self.first_name = _first_parameter(fun) if except_first and not labels else None

    def user_args(self, args: tuple) -> tuple:
        """The user's own positional arguments of the core's `args`."""
        return args[1:] if self.labels else args

    def positional(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """`(args, kwargs)` with the first argument, if given by keyword alone,
        moved to `args`."""
        name = self.first_name
        if name is not None and not args and name in kwargs:
            kwargs = dict(kwargs)
            args = (kwargs.pop(name),)
        return args, kwargs


def _first_parameter(fun: Callable) -> str | None:
    """The name of `fun`'s first parameter, if it can be passed by keyword too."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None
    if params and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return params[0].name
    return None


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
