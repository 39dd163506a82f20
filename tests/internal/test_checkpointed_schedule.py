"""The checkpointed `while_loop`: which states the forward pass keeps (online
Stumm-Walther, then Wang-Moin), the backward pass's recomputations (binomial),
buffers never stored, and only perturbed leaves differentiated."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.internal as bwi
from boxwood.internal import _online_schedule, while_loop

# One compiled program per slot count `c`, called once per step (run eagerly, the
# schedule's few dozen small operations are dispatched one by one every step).
_next_slot = jax.jit(_online_schedule.next_slot, static_argnums=0)


def _kept_after(c, n):
    """The steps whose states the forward pass holds after `n` steps, simulated
    with the schedule itself."""
    sched = _online_schedule.initial_state(c)
    slots = {}
    for i in range(n):
        i = jnp.asarray(i, jnp.int32)
        slot, sched = _next_slot(c, i, sched, jnp.asarray(True))
        slot = int(slot)
        if slot < c:
            assert slot != 0 or i == 0, "state 0 is never evicted"
            slots[slot] = i
    return sorted(slots.values())


@pytest.mark.parametrize(
    "c, n, kept",
    [
        (4, 4, [0, 1, 2, 3]),
        (4, 5, [0, 1, 2, 3]),  # state 4 is the last of run 0: not kept
        (4, 6, [0, 1, 2, 5]),  # run 1 starts at 5, evicting run 0's last state
        (4, 7, [0, 2, 5, 6]),  # ... then from the front
        (4, 10, [0, 5, 6, 9]),
        (4, 15, [0, 5, 9, 12]),  # the end of phase 1: beta(4, 2) = 15 steps
        (2, 6, [0, 3]),
        (2, 8, [0, 7]),  # phase 2: no state is dispensable, the latest is replaced
        (3, 11, [0, 4, 10]),
        (3, 12, [0, 10, 11]),  # state 4 (level 0, before 10 of level 1) dispensable
        (1, 9, [0]),
    ],
)
def test_states_kept_by_the_forward_pass(c, n, kept):
    assert _kept_after(c, n) == kept


_LONGEST = 64  # the most steps of the tests below: the buffer's length
_ORDER = []  # the steps the body ran, in order, in the latest `_trace_steps`


@functools.cache
def _value_and_grad(c):
    """`value_and_grad(f)(y0, n)` for the loop `y <- y * cos(y) + 1` run `n` times
    with `c` slots, each run of the body recorded in `_ORDER`. One program per `c`
    for every `n` (an argument: only `cond` sees it; eagerly, each loop of the
    forward and backward pass compiles on its own, and their small operations
    one by one)."""

    def body(carry):
        i, y, buf = carry
        jax.debug.callback(lambda k: _ORDER.append(int(k)), i, ordered=True)
        buf = buf.at[i].set(y)
        return i + 1, y * jnp.cos(y) + 1.0, buf

    def f(y0, n):
        out = while_loop(
            lambda carry: carry[0] < n, body, (0, y0, jnp.zeros(_LONGEST + 1)),
            kind="checkpointed", checkpoints=c,
        )  # fmt: skip
        return out[1] + jnp.sum(out[2])

    return jax.jit(jax.value_and_grad(f))


def _trace_steps(c, n):
    """`(value, grad, order of the steps the body ran)` for the loop
    `y <- y * cos(y) + 1` run `n` times, differentiated at 0.3."""
    assert n <= _LONGEST
    _ORDER.clear()
    value, grad = jax.block_until_ready(_value_and_grad(c)(0.3, n))
    jax.effects_barrier()
    return value, grad, list(_ORDER)


def _reference(n):
    def f(y0):
        y, total = y0, 0.0
        for _ in range(n):
            total = total + y
            y = y * jnp.cos(y) + 1.0
        return y + total

    return jax.value_and_grad(f)(0.3)


@pytest.mark.parametrize("c, n", [(1, 3), (2, 5), (3, 10), (4, 15), (6, 20)])
def test_backward_recomputes_each_step_at_most_twice_in_phase_one(c, n):
    value, grad, order = _trace_steps(c, n)
    want_value, want_grad = _reference(n)
    assert np.allclose(value, want_value, rtol=1e-5)
    assert np.allclose(grad, want_grad, rtol=1e-4)
    forward, backward = order[:n], order[n:]
    assert forward == list(range(n))
    runs = collections.Counter(backward)
    # each step runs once more to be pulled back, and is recomputed at most twice
    assert set(runs) == set(range(n))
    assert max(runs.values()) <= 3, runs
    # steps are pulled back last to first: the last run of each step is in order
    last_run = {k: i for i, k in enumerate(backward)}
    assert sorted(last_run, key=last_run.get) == list(reversed(range(n)))


@pytest.mark.parametrize("c, n", [(2, 30), (3, 40), (5, 64)])
def test_gradients_past_phase_one(c, n):
    value, grad, order = _trace_steps(c, n)
    want_value, want_grad = _reference(n)
    assert np.allclose(value, want_value, rtol=1e-5)
    assert np.allclose(grad, want_grad, rtol=1e-4)
    assert order[:n] == list(range(n))


def test_known_orders_of_recomputation():
    # 8 steps, 2 slots: states 0 and 7 kept; 7 pulled back, then state 3 stored on
    # the way to 6, and the first three steps reversed with a slot each.
    *_, order = _trace_steps(2, 8)
    assert order[8:] == [7, 0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 3, 4, 3, 0, 1, 2, 1, 0]
    *_, order = _trace_steps(4, 7)
    assert order[7:] == [6, 5, 2, 3, 4, 3, 2, 0, 1, 0]


def test_buffers_are_not_stored_in_checkpoints():
    size, c = 1000, 50

    def f(xs):
        def body(carry):
            i, y, buf = carry
            return i + 1, y + 1.0, buf.at[i].set(y * xs[i])

        out = while_loop(
            lambda carry: carry[0] < size, body, (0, 0.0, jnp.zeros(size)),
            kind="checkpointed", checkpoints=c, buffers=lambda carry: carry[2],
        )  # fmt: skip
        return jnp.sum(out[2])

    xs = jnp.arange(size, dtype=jnp.float32)
    jaxpr = str(jax.make_jaxpr(jax.grad(f))(xs))
    assert f"f32[{c + 1}]" in jaxpr  # the scalar `y` is stored ...
    assert f"f32[{c + 1},{size}]" not in jaxpr  # ... the buffer is not
    assert np.allclose(jax.jit(jax.grad(f))(xs), np.arange(size, dtype=np.float32))


def test_unperturbed_leaves_are_not_differentiated():
    def f(x, y):
        def body(carry):
            a, b = carry
            # `b` never depends on `x`: it is not differentiated, so this passes
            return a * x + bwi.nondifferentiable(b), b + 1.0

        a, b = while_loop(lambda _: True, body, (x, y), kind="checkpointed",
                          max_steps=3)  # fmt: skip
        return a + jax.lax.stop_gradient(b)

    # a = x**4 + x**2 + 2 x + 3 after three steps
    # one program (eagerly, the loops' small operations compile one by one)
    assert np.allclose(jax.jit(jax.grad(f))(2.0, 1.0), 4 * 2.0**3 + 2 * 2.0 + 2)

    def g(x):
        def body(carry):
            return bwi.nondifferentiable(carry * x, msg="perturbed!")

        return while_loop(lambda _: True, body, x, kind="checkpointed", max_steps=2)

    with pytest.raises(RuntimeError, match="perturbed!"):
        jax.grad(g)(2.0)
