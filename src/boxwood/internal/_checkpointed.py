"""The `"checkpointed"` kind of `while_loop`: reverse-mode differentiable with a
bounded number of stored states, for loops whose length is known only at run time.

Forward pass: run the loop, storing the state every `stride` steps in a buffer of
`checkpoints` slots. When the buffer is full, every other stored state is dropped
and `stride` doubles, so any number of steps fits (the states kept are always at
steps `0, stride, 2 * stride, ...`).

Backward pass: walk the stored states from the last to the first. For each step
between two of them (latest first), recompute that step's input state from the
stored state before it, and pull the cotangent back through the step. That costs
`O(stride)` recomputed steps per step: `O(n**2 / checkpoints)` in all, for memory of
`checkpoints` states. The loop's body is closure-converted first, so arrays it
closes over (model parameters) get cotangents too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._closure_convert import filter_closure_convert
from .._filters import combine, is_array, is_inexact_array, partition
from .._jvp import filter_vjp


def _tree_where(pred: Any, a: Any, b: Any) -> Any:
    return jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)


def _inexact_only(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: x if is_inexact_array(x) else None, tree)


def _scalars_as_arrays(tree: Any) -> Any:
    # Inside `custom_vjp` rules a weakly typed Python scalar input arrives as JAX's
    # typed float/int (no `.shape`), not as an array.
    scalar = (bool, int, float, complex)
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(x) if isinstance(x, scalar) else x, tree
    )


def _forward(body: Any, cond: Any, arrays: Any, max_steps: Any, slots: int) -> tuple:
    body, cond, arrays = _scalars_as_arrays((body, cond, arrays))
    buf = jax.tree_util.tree_map(
        lambda x: jnp.zeros((slots, *x.shape), x.dtype), arrays
    )
    zero = jnp.asarray(0)
    state = (zero, arrays, buf, jnp.zeros(slots, zero.dtype), zero, zero + 1)

    def live(s: tuple) -> Any:
        step, val = s[0], s[1]
        keep_going = cond(val)
        return keep_going if max_steps is None else keep_going & (step < max_steps)

    def thin(buf: Any, at: Any) -> tuple:
        half = jax.tree_util.tree_map(lambda b: b[::2], buf)
        pad = lambda b: jnp.concatenate([b, jnp.zeros_like(b)])  # noqa: E731
        return jax.tree_util.tree_map(pad, half), pad(at[::2])

    def step_fn(s: tuple) -> tuple:
        step, val, buf, at, count, stride = s
        full = (step % stride == 0) & (count == slots)
        thinned, thinned_at = thin(buf, at)
        buf = _tree_where(full, thinned, buf)
        at = jnp.where(full, thinned_at, at)
        count = jnp.where(full, slots // 2, count)
        stride = jnp.where(full, stride * 2, stride)
        store = step % stride == 0
        stored = jax.tree_util.tree_map(lambda b, v: b.at[count].set(v), buf, val)
        buf = _tree_where(store, stored, buf)
        at = jnp.where(store, at.at[count].set(step), at)
        count = count + store.astype(count.dtype)
        return step + 1, body(val), buf, at, count, stride

    return jax.lax.while_loop(live, step_fn, state)


def _backward(body: Any, residuals: tuple, ct: Any) -> tuple:
    buf, at, count, n = residuals
    ct_body = jax.tree_util.tree_map(jnp.zeros_like, _inexact_only(body))

    def through_step(k: Any, start: Any, j: Any, cts: tuple) -> tuple:
        ct_val, ct_body = cts
        saved = jax.tree_util.tree_map(lambda b: b[k], buf)
        val = jax.lax.fori_loop(0, j - start, lambda _, v: body(v), saved)
        _, vjp_fn = filter_vjp(lambda b, v: b(v), body, val)
        d_body, d_val = vjp_fn(ct_val)
        ct_body = jax.tree_util.tree_map(jnp.add, ct_body, d_body)
        return _inexact_only(d_val), ct_body

    def segment(i: Any, cts: tuple) -> tuple:
        k = count - 1 - i
        start = at[k]
        end = jnp.where(k == count - 1, n, at[jnp.minimum(k + 1, at.shape[0] - 1)])
        length = end - start
        return jax.lax.fori_loop(
            0, length, lambda m, c: through_step(k, start, end - 1 - m, c), cts
        )

    ct_val, ct_body = jax.lax.fori_loop(0, count, segment, (_inexact_only(ct), ct_body))
    return ct_body, ct_val


def _make_loop(body_static: Any, cond_static: Any) -> Callable:
    """The loop as a `custom_vjp` of the converted functions' arrays (their other
    leaves, such as jaxprs, are closed over)."""

    def both(body_dyn: Any, cond_dyn: Any) -> tuple:
        return combine(body_dyn, body_static), combine(cond_dyn, cond_static)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
    def loop(body_dyn: Any, cond_dyn: Any, arrays: Any, max_steps: Any, slots: int):
        body, cond = both(body_dyn, cond_dyn)
        return _forward(body, cond, arrays, max_steps, slots)[1]

    def fwd(body_dyn: Any, cond_dyn: Any, arrays: Any, max_steps: Any, slots: int):
        body, cond = both(body_dyn, cond_dyn)
        n, val, buf, at, count, _ = _forward(body, cond, arrays, max_steps, slots)
        return val, (body_dyn, cond_dyn, (buf, at, count, n))

    def bwd(max_steps: Any, slots: int, res: tuple, ct: Any) -> tuple:
        body_dyn, cond_dyn, residuals = res
        # so that a closed-over float is differentiated
        body = _scalars_as_arrays(both(body_dyn, cond_dyn)[0])
        ct_body, ct_val = _backward(body, residuals, ct)
        no_ct_cond = jax.tree_util.tree_map(lambda _: None, cond_dyn)
        return ct_body, no_ct_cond, ct_val

    loop.defvjp(fwd, bwd)
    return loop


def checkpointed_while(
    cond: Callable, body: Callable, arrays: Any, max_steps: Any, slots: int
) -> Any:
    """Run the loop on the pytree of arrays `arrays` (see the module docstring)."""
    body_dyn, body_static = partition(filter_closure_convert(body, arrays), is_array)
    cond_dyn, cond_static = partition(filter_closure_convert(cond, arrays), is_array)
    loop = _make_loop(body_static, cond_static)
    return loop(body_dyn, cond_dyn, arrays, max_steps, slots)
