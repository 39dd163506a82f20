"""`filter_scan`: `jax.lax.scan` over pytrees that may hold non-arrays;
`unrolled_scan`: the same steps traced one after the other, without a scan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._filters import combine, is_array, partition
from .._module import as_pytree_function
from .._tracebacks import hiding_own_frames
from ._split import OutBox, describe, keystr, split_out, static_equal


def _check_carry(init: Any, new: Any) -> None:
    """Raise unless `new` has the structure and the non-array leaves of `init`."""
    init_leaves, init_def = jax.tree_util.tree_flatten_with_path(init)
    new_leaves, new_def = jax.tree_util.tree_flatten(new)
    if new_def != init_def:
        raise ValueError(
            "`filter_scan`: the step function returned a carry whose structure differs "
            f"from `init`'s.\n  init: {init_def}\n  returned: {new_def}\nThe carry "
            "must keep its structure from step to step."
        )
    for (path, old), x in zip(init_leaves, new_leaves):
        if is_array(old) and is_array(x):
            continue
        if not is_array(old) and not is_array(x) and static_equal(old, x):
            continue
        raise ValueError(
            f"`filter_scan`: the step function changed the carry leaf "
            f"`carry{keystr(path)}` from {describe(old)} to {describe(x)}. Only the "
            "arrays of the carry may change from step to step; its non-array leaves "
            "(Python numbers, strings, ...) must be returned unchanged. To carry a "
            "changing number, make it an array in `init` (e.g. `jnp.asarray(0)`)."
        )


def _check_xs(xs: Any, length: int | None) -> None:
    """Raise unless the arrays of `xs` share a leading axis (of size `length`)."""
    sizes = {}
    for path, x in jax.tree_util.tree_flatten_with_path(xs)[0]:
        if not is_array(x):
            continue
        where = f"xs{keystr(path)}"
        if x.ndim == 0:
            raise ValueError(
                f"`filter_scan`: `{where}` is a scalar array, but the arrays of `xs` "
                "are scanned along their leading axis. (Under `jax.jit`, Python "
                "numbers in a module become scalar arrays: use `boxwood.filter_jit`, "
                "which keeps them static.)"
            )
        sizes.setdefault(x.shape[0], where)
    if length is not None:
        sizes.setdefault(length, "`length`")
    if len(sizes) > 1:
        found = ", ".join(f"{n} for {where}" for n, where in sizes.items())
        raise ValueError(
            "`filter_scan`: the arrays of `xs` must share the size of their leading "
            f"axis (the number of steps), but it is {found}."
        )


def _as_pair(out: Any) -> tuple[Any, Any]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            "`filter_scan`: the step function must return a pair `(carry, y)`; got "
            f"{type(out).__name__}."
        )
    return out


@hiding_own_frames
def filter_scan(
    fun: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """`jax.lax.scan` for pytrees holding arbitrary Python objects, such as modules.

    Computes `carry, y = fun(carry, x)` for each `x` of `xs` (its arrays sliced along
    their leading axis), stacking the `y`s. The arrays are scanned over; every other
    leaf is passed through unchanged.

    **Arguments:**

    - `fun`: the step, `fun(carry, x) -> (carry, y)`. The returned carry must have
      the structure and the non-array leaves of `init` (arrays keep their shapes and
      dtypes); otherwise a `ValueError` names the leaf that changed.
    - `init`: the initial carry, any pytree.
    - `xs`: the pytree scanned over. Its arrays share a leading axis; its other
      leaves are given to every step as they are. A module whose arrays are stacked
      (e.g. built with [`boxwood.filter_vmap`][]) is scanned over layer by layer.
      May be `None`, with `length` given.
    - `length`: the number of steps, needed when `xs` holds no arrays.
    - `reverse`, `unroll`: as in `jax.lax.scan`.

    **Returns:**

    `(final_carry, ys)`: the arrays of `ys` are stacked along a new leading axis; its
    non-array leaves are returned as the step produced them.

    >>> import boxwood, jax.numpy as jnp
    >>> step = lambda c, x: ((c[0] + x, c[1]), c[0] * x)
    >>> carry, ys = boxwood.filter_scan(step, (jnp.array(0.0), "tag"), jnp.arange(3.0))
    >>> carry
    (Array(3., dtype=float32), 'tag')
    """
    fun = as_pytree_function(fun)
    _check_xs(xs, length)
    init_arrays, init_static = partition(init, is_array)
    xs_arrays, xs_static = partition(xs, is_array)
    box = OutBox()

    def step(carry_arrays: Any, x_arrays: Any) -> tuple[Any, Any]:
        carry = combine(carry_arrays, init_static)
        new_carry, y = _as_pair(fun(carry, combine(x_arrays, xs_static)))
        _check_carry(init, new_carry)
        return partition(new_carry, is_array)[0], split_out(y, box)

    carry_arrays, ys_arrays = jax.lax.scan(
        step, init_arrays, xs_arrays, length=length, reverse=reverse, unroll=unroll
    )
    return combine(carry_arrays, init_static), combine(ys_arrays, box.get())


@hiding_own_frames
def unrolled_scan(
    fun: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, length: int
) -> tuple[Any, Any]:
    """[`boxwood.filter_scan`][]`(fun, init, xs, length)` traced as a Python loop:
    the program holds `length` copies of the step and no `scan` (so its compile
    time grows with `length`, and the compiler may schedule across steps).

    Each array of `xs` is taken apart once (`unstack`, whose gradient is one
    `stack`), each step reading its slices at static positions; the arrays of
    the `y`s are stacked, their other leaves are the first step's. The carry is
    checked as `filter_scan` checks it. `length` is a positive int.
    """
    _check_xs(xs, length)
    xs_arrays, xs_static = partition(xs, is_array)
    leaves, treedef = jax.tree_util.tree_flatten(xs_arrays)
    slices = [jnp.unstack(leaf) for leaf in leaves]
    carry, ys = init, []
    for i in range(length):
        x = combine(treedef.unflatten([s[i] for s in slices]), xs_static)
        carry, y = _as_pair(fun(carry, x))
        _check_carry(init, carry)
        ys.append(y)
    arrays = [partition(y, is_array)[0] for y in ys]
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *arrays)
    return carry, combine(stacked, partition(ys[0], is_array)[1])
