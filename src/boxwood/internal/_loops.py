"""`while_loop` (lax, bounded and checkpointed kinds) and `scan`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax._src.lax.lax import _convert_element_type  # no public way to keep weak types

from .._filters import combine, is_array, partition
from ._buffers import unwrap_buffers, wrap_buffers
from ._checkpointed import checkpointed_while

_KINDS = ("lax", "checkpointed", "bounded")


def _as_arrays(tree: Any) -> Any:
    """Python numbers become arrays, so that the loop can carry them."""

    def convert(x: Any) -> Any:
        return jnp.asarray(x) if isinstance(x, (bool, int, float, complex)) else x

    return jax.tree_util.tree_map(convert, tree)


def _split_carry(init_val: Any) -> tuple:
    """The carry's arrays, and a function rebuilding the whole carry from them (its
    other leaves must not change from one step to the next)."""
    arrays, others = partition(init_val, is_array)

    def rebuild(a: Any) -> Any:
        return combine(a, others)

    return arrays, rebuild


def _keep_weak_types(init: Any, out: Any) -> Any:
    """`out` with each leaf weakly typed where the initial value's was (a Python
    number in the carry): the loop's arithmetic may make it strongly typed, and a
    strongly typed int32 and int64 do not mix under strict type promotion."""

    def fix(x: Any, y: Any) -> Any:
        if jax.typeof(x).weak_type and not jax.typeof(y).weak_type:
            if jnp.result_type(x) == jnp.result_type(y):
                return _convert_element_type(y, weak_type=True)
        return y

    return jax.tree_util.tree_map(fix, init, out)


def _buffer_leaves(arrays: Any, rebuild: Callable, buffers: Any) -> Any:
    """`arrays` with each array replaced by whether `buffers` selects it (asked of
    distinct stand-ins, so that one array passed twice is told apart)."""
    if buffers is None:
        return jax.tree_util.tree_map(lambda _: False, arrays)
    stand_ins = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), arrays
    )
    selected = {id(x) for x in jax.tree_util.tree_leaves(buffers(rebuild(stand_ins)))}
    return jax.tree_util.tree_map(lambda x: id(x) in selected, stand_ins)


def _check_max_steps(max_steps: Any, kind: str) -> None:
    if max_steps is None:
        if kind == "bounded":
            raise ValueError(
                "`while_loop(kind='bounded')` needs `max_steps=` (an int): the loop is "
                "unrolled into nested scans of that many steps."
            )
        return
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0:
        raise ValueError(
            f"`max_steps` must be a non-negative int or None; got {max_steps!r}."
        )


def while_loop(
    cond_fun: Callable[[Any], Any],
    body_fun: Callable[[Any], Any],
    init_val: Any,
    *,
    max_steps: int | None = None,
    buffers: Callable[[Any], Any] | None = None,
    kind: str,
    checkpoints: int | None = None,
    base: int = 16,
) -> Any:
    """`jax.lax.while_loop` that can be differentiated in reverse mode, with a step
    bound (Equinox's `equinox.internal.while_loop`).

    **Arguments:**

    - `cond_fun`, `body_fun`, `init_val`: as `jax.lax.while_loop`. The carry may be any
      pytree; its non-array leaves must stay the same from step to step.
    - `max_steps`: stop after this many steps even if `cond_fun` is still true;
      `None` for no bound.
    - `buffers`: a function selecting arrays of the carry (`buffers(carry)`, any
      pytree of them) that `cond_fun`/`body_fun` see as buffers: `buf[i]` reads,
      `buf.at[i].set(x, pred=p)` writes where the boolean scalar `p` is true (the
      default). The result is an ordinary array again. (Equinox uses this to update
      the arrays in place; boxwood gives the same results without that
      optimisation.)
    - `kind`: keyword-only, required.
        - `"lax"`: `jax.lax.while_loop`; forward-mode differentiable only.
        - `"checkpointed"`: reverse-mode differentiable with bounded memory: the
          forward pass keeps at most `checkpoints` states, chosen online (the
          number of steps is not known in advance), and the backward pass
          recomputes the steps between them with binomial checkpointing. Up to
          `(checkpoints + 1) * (checkpoints + 2) / 2` steps, each step is
          recomputed at most twice. Buffers are not stored (each of their
          elements is written once, so recomputed steps read the final buffers).
          Not forward-mode differentiable.
        - `"bounded"`: nested `lax.scan`s of `base` steps each, skipped once
          `cond_fun` is false; differentiable in both modes; needs `max_steps`.
    - `checkpoints`: for `"checkpointed"`, how many states to keep (at least 1);
      by default `ceil(sqrt(max_steps))`, or 64 without `max_steps`.
    - `base`: for `"bounded"`, the steps per scan level.

    **Returns:**

    The final carry, as `jax.lax.while_loop`.

    >>> import jax, jax.numpy as jnp
    >>> from boxwood.internal import while_loop
    >>> def power(x):
    ...     return while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x),
    ...                       (0, jnp.array(1.0)), kind="checkpointed", max_steps=10)[1]
    >>> jax.grad(power)(2.0)  # d/dx x**3 = 3 x**2
    Array(12., dtype=float32, weak_type=True)
    """
    if kind not in _KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(_KINDS)}; got {kind!r}.")
    _check_max_steps(max_steps, kind)
    return _while_loop(
        cond_fun, body_fun, init_val, buffers, kind, max_steps, checkpoints, base
    )


def _while_loop(
    cond_fun: Callable,
    body_fun: Callable,
    init_val: Any,
    buffers: Callable | None,
    kind: str,
    max_steps: int | None,
    checkpoints: int | None,
    base: int,
) -> Any:
    """`while_loop`, once `kind` and `max_steps` are checked (`checkpoints` and
    `base` are checked by the kinds that use them)."""
    arrays, rebuild = _split_carry(_as_arrays(init_val))
    tag = object()  # marks this loop's buffers

    def cond(a: Any) -> Any:
        return cond_fun(wrap_buffers(rebuild(a), buffers, tag))

    def body(a: Any, live: Any = None) -> Any:
        out = body_fun(wrap_buffers(rebuild(a), buffers, tag, live))
        out = unwrap_buffers(out, tag)
        # Python numbers in the output become arrays, as in the initial value (and
        # as `lax.while_loop` does).
        return partition(_as_arrays(out), is_array)[0]

    if max_steps == 0:
        return rebuild(arrays)
    if kind == "lax":
        out = _lax_loop(cond, body, arrays, max_steps)
    elif kind == "bounded":
        assert max_steps is not None  # `_check_max_steps` requires it
        out = _bounded_loop(cond, body, arrays, max_steps, base)
    else:
        checkpoints = _checkpoint_count(checkpoints, max_steps)
        is_buffer = _buffer_leaves(arrays, rebuild, buffers)
        out = checkpointed_while(cond, body, arrays, max_steps, checkpoints, is_buffer)
    return rebuild(_keep_weak_types(arrays, out))


def _checkpoint_count(checkpoints: Any, max_steps: int | None) -> int:
    """How many states the `"checkpointed"` kind keeps: `checkpoints` (checked) or
    its default, at most one per step."""
    if checkpoints is None:
        checkpoints = 64 if max_steps is None else math.isqrt(max_steps - 1) + 1
    if isinstance(checkpoints, bool) or not isinstance(checkpoints, int):
        raise ValueError(f"`checkpoints` must be an int >= 1; got {checkpoints!r}.")
    if checkpoints < 1:
        raise ValueError(f"`checkpoints` must be an int >= 1; got {checkpoints!r}.")
    if max_steps is not None:  # more slots than steps would never be used
        checkpoints = min(checkpoints, max(max_steps, 1))
    return checkpoints


def _counted(cond: Callable, body: Callable, max_steps: int) -> tuple:
    """`(live, advance)` on states `(step, arrays)`: whether the loop runs another
    step (at most `max_steps` in all), and one step, counted."""

    def live(state: tuple) -> Any:
        return cond(state[1]) & (state[0] < max_steps)

    def advance(state: tuple) -> tuple:
        return state[0] + 1, body(state[1])

    return live, advance


def _lax_loop(cond: Callable, body: Callable, arrays: Any, max_steps: Any) -> Any:
    if max_steps is None:
        return jax.lax.while_loop(cond, body, arrays)
    live, advance = _counted(cond, body, max_steps)
    return jax.lax.while_loop(live, advance, (jnp.asarray(0), arrays))[1]


def _levels(max_steps: int, base: int) -> int:
    """The least `k >= 1` with `base**k >= max_steps`."""
    k, capacity = 1, base
    while capacity < max_steps:
        k, capacity = k + 1, capacity * base
    return k


def _bounded_loop(
    cond: Callable, body: Callable, arrays: Any, max_steps: int, base: int
) -> Any:
    """`base**levels >= max_steps` step slots, as a tree: a block of level `k` runs
    `base` blocks of level `k - 1` in a `fori_loop` (a `scan`: reverse-mode
    differentiable), each skipped once the loop has finished. Blocks of more
    than one step are rematerialised, so that the backward pass holds the states
    between blocks of one level at a time: O(base * levels) states."""
    if isinstance(base, bool) or not isinstance(base, int) or base < 2:
        raise ValueError(f"`base` must be an int >= 2; got {base!r}.")
    live, block = _counted(cond, body, max_steps)
    for level in range(_levels(max_steps, base)):
        guarded = _unless_finished(live, block)
        if level > 0:  # guard included: only the state entering the block is stored
            guarded = jax.checkpoint(guarded, prevent_cse=False)
        block = _repeated(guarded, base)
    return block((jnp.asarray(0), arrays))[1]


def _unless_finished(live: Callable, block: Callable) -> Callable:
    """`block`, run only from a state where `live` holds (else the state is kept)."""

    def guarded(state: tuple) -> tuple:
        return jax.lax.cond(live(state), block, _unchanged, state)

    return guarded


def _unchanged(state: tuple) -> tuple:
    return state


def _repeated(block: Callable, times: int) -> Callable:
    """`block` applied `times` times (a static count: lowered to a `scan`)."""

    def run(state: tuple) -> tuple:
        return jax.lax.fori_loop(0, times, lambda _, s: block(s), state)

    return run


def scan(
    f: Callable[[Any, Any], tuple],
    init: Any,
    xs: Any,
    length: int | None = None,
    *,
    buffers: Callable[[Any], Any] | None = None,
    kind: str,
    checkpoints: int | str | None = None,
) -> tuple:
    """`jax.lax.scan`, optionally checkpointed to save memory on the backward pass
    (Equinox's `equinox.internal.scan`).

    **Arguments:**

    - `f`, `init`, `xs`, `length`: as `jax.lax.scan`.
    - `buffers`: selects arrays of the carry that `f` sees as buffers; see
      [`boxwood.internal.while_loop`][].
    - `kind`: `"lax"` (plain `lax.scan`) or `"checkpointed"`: the steps run in
      `checkpoints` blocks, and only the carry between blocks is stored for the
      backward pass (each block is recomputed there).
    - `checkpoints`: for `"checkpointed"`, the number of blocks; `"all"` stores every
      step's carry; by default about `sqrt(length)`.

    **Returns:**

    `(final_carry, stacked_ys)`, as `jax.lax.scan`.

    >>> import jax.numpy as jnp
    >>> from boxwood.internal import scan
    >>> step = lambda c, x: (c + x, c + x)
    >>> scan(step, jnp.zeros(()), jnp.arange(4.0), kind="checkpointed", checkpoints=2)
    (Array(6., dtype=float32), Array([0., 1., 3., 6.], dtype=float32))
    """
    init, xs = _as_arrays((init, xs))
    if buffers is not None:
        f = _with_buffers(f, buffers)
    if kind == "lax":
        return jax.lax.scan(f, init, xs, length)
    if kind != "checkpointed":
        raise ValueError(f"`kind` must be 'lax' or 'checkpointed'; got {kind!r}.")
    n = _scan_length(xs, length)
    if checkpoints == "all" or n == 0:
        return jax.lax.scan(f, init, xs, n)
    blocks = math.isqrt(max(n - 1, 0)) + 1 if checkpoints is None else int(checkpoints)
    if blocks < 1:
        raise ValueError(f"`checkpoints` must be >= 1 or 'all'; got {checkpoints!r}.")
    size = -(-n // blocks)
    blocks = -(-n // size)
    return _blocked_scan(f, init, xs, n, blocks, size)


def _scan_length(xs: Any, length: int | None) -> int:
    """The number of steps: `length`, or the leading axis the arrays of `xs`
    share."""
    sources = [] if length is None else [("`length`", length)]
    for path, x in jax.tree_util.tree_leaves_with_path(xs):
        where = f"xs{jax.tree_util.keystr(path)}"
        if jnp.ndim(x) == 0:
            raise ValueError(
                f"`scan`: `{where}` is a scalar; the leaves of `xs` are scanned "
                "along their leading axis, so each needs one."
            )
        sources.append((where, jnp.shape(x)[0]))
    if not sources:
        raise ValueError("`scan`: give `length=` when `xs` holds no arrays.")
    found = {n for _, n in sources}
    if len(found) > 1:
        each = ", ".join(f"{n} for {where}" for where, n in sources)
        raise ValueError(
            f"`scan`: `xs` and `length` give different lengths {sorted(found)} "
            f"({each}); they must agree."
        )
    return sources[0][1]


def _blocked_scan(
    f: Callable, init: Any, xs: Any, n: int, blocks: int, size: int
) -> tuple:
    pad = blocks * size - n

    def padded(x: Any) -> Any:
        x = jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]), x.dtype)]) if pad else x
        return x.reshape(blocks, size, *x.shape[1:])

    xs_blocks = jax.tree_util.tree_map(padded, xs)
    _, y_struct = jax.eval_shape(f, init, jax.tree_util.tree_map(lambda x: x[0], xs))

    def step(carry: tuple, x: Any) -> tuple:
        i, c = carry
        if not pad:
            c, y = f(c, x)
            return (i + 1, c), y

        def run(c: Any) -> tuple:
            return f(c, x)

        def skip(c: Any) -> tuple:
            zeros = jax.tree_util.tree_map(
                lambda s: jnp.zeros(s.shape, s.dtype), y_struct
            )
            return c, zeros

        c, y = jax.lax.cond(i < n, run, skip, c)
        return (i + 1, c), y

    @jax.checkpoint
    def block(carry: tuple, x_block: Any) -> tuple:
        return jax.lax.scan(step, carry, x_block, length=size)

    start = (jnp.asarray(0), init)
    (_, carry), ys = jax.lax.scan(block, start, xs_blocks, length=blocks)
    ys = jax.tree_util.tree_map(
        lambda y: y.reshape(blocks * size, *y.shape[2:])[:n], ys
    )
    return carry, ys


def _with_buffers(f: Callable, buffers: Callable) -> Callable:
    tag = object()  # marks this scan's buffers

    def step(carry: Any, x: Any) -> tuple:
        carry, y = f(wrap_buffers(carry, buffers, tag), x)
        return unwrap_buffers(carry, tag), y

    return step
