"""The backward pass of the checkpointed `while_loop`: one `while` loop (its size
against Equinox's), the binomial plan without a loop (`_treeverse.Planner`), the
gradients against a plain `lax.scan`, and how many steps it recomputes against
the optimal offline schedule."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _jaxprs import all_equations
from boxwood.internal import _online_schedule, _treeverse, while_loop

_INT32_MAX = int(np.iinfo(np.int32).max)


@functools.cache  # shared by the cases: those of int32's maximum draw the same pairs
def _reference_advance(length, s):
    """`_treeverse`'s rule from the binomial coefficients themselves: the least `t`
    with `C(s + t, s) >= length` (by bisection: near int32's maximum, counting `t`
    up takes tens of thousands of steps per length), then `length` less the
    steps `s - 1` slots reverse in `t` sweeps, at least 1."""
    lo, hi = 0, 1
    while math.comb(s + hi, s) < length:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if math.comb(s + mid, s) < length:
            lo = mid + 1
        else:
            hi = mid
    return max(1, length - math.comb(s - 1 + lo, s - 1))


@pytest.mark.parametrize(
    "slots, longest",
    [(2, 100), (3, 50), (8, 500), (5, _INT32_MAX), (64, _INT32_MAX)],
    ids=["two-slots", "three-slots", "table-only", "closed-form", "default-online"],
)
def test_planner_matches_the_binomial_rule(slots, longest):
    planner = _treeverse.Planner(slots, longest)
    # with int32's maximum as the longest loop, `s == 2` uses the closed form
    assert planner.closed_form == (longest == _INT32_MAX)
    rng = np.random.default_rng(0)
    lengths, ss = [], []
    for s in range(2, slots + 1):
        some = [*range(2, min(longest, 120) + 1), *rng.integers(2, longest, 40)]
        lengths += [int(x) for x in some] + [longest]
        ss += [s] * (len(some) + 1)
    got = jax.jit(jax.vmap(planner.advance_by))(
        jnp.asarray(lengths, jnp.int32), jnp.asarray(ss, jnp.int32)
    )
    want = [_reference_advance(n, s) for n, s in zip(lengths, ss)]
    assert np.asarray(got).tolist() == want


def test_a_row_of_the_table_is_the_binomial_coefficients_capped_at_int32():
    """Row `s` of the schedule's table is `beta(s, t) = C(s + t, s)` for `t = 0,
    1, ...` up to the first value reaching `longest`, capped at int32's maximum."""
    assert _treeverse._row(3, 35) == [math.comb(3 + t, 3) for t in range(5)]
    row = _treeverse._row(2, _INT32_MAX)
    assert len(row) == 65536  # C(65536, 2) < int32 max <= C(65537, 2)
    assert row[-2] == math.comb(65536, 2) < _INT32_MAX
    assert row[-1] == _INT32_MAX  # capped


# --- gradients against a plain scan ------------------------------------------------


def _step(w, y, i):
    return jnp.tanh(w * y + 0.1 * i.astype(jnp.float32))


def _checkpointed(w, y0, n, checkpoints, max_steps):
    def body(carry):
        i, y = carry
        return i + 1, _step(w, y, i)

    out = while_loop(
        lambda carry: carry[0] < n, body, (jnp.asarray(0), y0),
        kind="checkpointed", checkpoints=checkpoints, max_steps=max_steps,
    )  # fmt: skip
    return out[1].sum()


_LONGEST_SCAN = 53  # the longest `n` of the tests below


def _scanned(w, y0, n):
    # the first `n` of `_LONGEST_SCAN` steps, the others selecting the carry as it
    # is: the same values and gradients as a scan of length `n`, with `n` traced
    def body(y, i):
        return jnp.where(i < n, _step(w, y, i), y), None

    return jax.lax.scan(body, y0, jnp.arange(_LONGEST_SCAN))[0].sum()


# Defined once: each wrapper keeps its own cache of compiled programs (a
# `(checkpoints, max_steps)` seen before is not compiled again; `n`, which only
# `cond` reads, is an argument).
_checkpointed_grad = jax.jit(
    jax.grad(_checkpointed, argnums=(0, 1)), static_argnums=(3, 4)
)
# the reference: one program for every `n` (eagerly, its two scans would compile
# on their own and the operations around them one by one)
_scanned_grad = jax.jit(jax.grad(_scanned, argnums=(0, 1)))


@pytest.mark.parametrize("max_steps", [None, 60], ids=["online", "max_steps"])
@pytest.mark.parametrize("n, checkpoints", [(1, 1), (9, 1), (17, 2), (40, 4), (53, 6)])
def test_gradients_equal_a_plain_scans(n, checkpoints, max_steps):
    w, y0 = jnp.asarray(0.9), jnp.linspace(-1.0, 1.0, 3)
    got = _checkpointed_grad(w, y0, n, checkpoints, max_steps)
    want = _scanned_grad(w, y0, n)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("checkpoints", [2, 12], ids=["scheduled", "every-state"])
def test_vmapped_loops_of_different_lengths_including_none(checkpoints):
    # one batch element takes no step: the backward pass must not run a step from
    # a state the loop never held (state 0 is written to its slot regardless)
    def loss(w, n):
        def body(carry):
            i, y = carry
            return i + 1, jnp.sqrt(y) * w

        out = while_loop(
            lambda carry: carry[0] < n, body, (0, jnp.asarray(4.0)),
            kind="checkpointed", checkpoints=checkpoints, max_steps=12,
        )  # fmt: skip
        return out[1]

    ns = jnp.array([0, 1, 5, 12])
    got = jax.jit(jax.vmap(jax.grad(loss)))(jnp.full(4, 1.5), ns)
    want = [jax.grad(lambda w, k=k: _power_chain(w, int(k)))(1.5) for k in ns]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.all(np.isfinite(got))


def _power_chain(w, k):
    y = jnp.asarray(4.0)
    for _ in range(k):
        y = jnp.sqrt(y) * w
    return y


# --- size of the differentiated program ---------------------------------------------


def _loop_loss(loop, max_steps, checkpoints):
    def f(x):
        def body(carry):
            i, y = carry
            return i + 1, jnp.tanh(x * y + 0.1)

        init = (0, jnp.ones(3))
        out = loop(lambda carry: carry[0] < 37, body, init, kind="checkpointed",
                   max_steps=max_steps, checkpoints=checkpoints)  # fmt: skip
        return out[1].sum()

    return f


def _size(f):
    text = jax.jit(jax.grad(f)).lower(0.7).as_text()
    return text.count("stablehlo.while"), len(text.splitlines())


# Measured with jax 0.10.2 (Equinox 0.13.8 gives 2 loops and 716 / 709 lines).
_ABSOLUTE = {"max_steps": (2, 520), "online": (2, 570)}


@pytest.mark.parametrize(
    "case, max_steps, checkpoints",
    [("max_steps", 40, 4), ("online", None, 8)],
    ids=["max_steps", "online"],
)
def test_gradient_program_is_no_larger_than_equinoxs(case, max_steps, checkpoints):
    whiles, lines = _size(_loop_loss(while_loop, max_steps, checkpoints))
    # the forward loop and one backward loop: no loop for the recomputation, none
    # for the plan
    assert whiles == 2
    try:
        import equinox.internal as eqxi
    except ImportError:
        bound = _ABSOLUTE[case]
    else:
        if eqxi.while_loop is while_loop:  # `equinox` is boxwood here
            bound = _ABSOLUTE[case]
        else:
            bound = _size(_loop_loss(eqxi.while_loop, max_steps, checkpoints))
    assert whiles <= bound[0] and lines <= bound[1], ((whiles, lines), bound)


def _while_bodies(f):
    closed = jax.make_jaxpr(jax.grad(f))(0.7)
    return [
        e.params["body_jaxpr"].jaxpr
        for e in all_equations(closed.jaxpr)
        if e.primitive.name == "while"
    ]


def _state_indices(body, primitive, slots):
    """The index operands with which `body` reads or writes the stored states of
    the float carry leaf (`(slots, 3)`, one row per slot)."""
    return [
        e.invars[2 if primitive == "dynamic_update_slice" else 1]
        for e in body.eqns
        if e.primitive.name == primitive and e.invars[0].aval.shape == (slots, 3)
    ]


def test_stored_states_are_written_and_reloaded_at_a_carried_slot():
    # The slot is computed once, at the end of the step before, and carried:
    # computed where it is used, XLA copies its arithmetic into the write or
    # load of every stored leaf, each then a distinct kernel to compile.
    forward, backward = _while_bodies(_loop_loss(while_loop, None, 8))
    writes = _state_indices(forward, "dynamic_update_slice", 9)
    loads = _state_indices(backward, "dynamic_slice", 9)
    assert writes and loads
    assert all(v in forward.invars for v in writes)
    assert all(v in backward.invars for v in loads)


def _cases(max_steps, checkpoints):
    text = jax.jit(jax.grad(_loop_loss(while_loop, max_steps, checkpoints)))
    return text.lower(0.7).as_text().count("stablehlo.case")


def test_a_loop_with_a_slot_for_every_state_reverses_without_conditionals():
    # 37 steps: no schedule in the forward loop, and each backward iteration
    # pulls back through one step from its own stored state
    assert _cases(40, 40) == 0
    assert _cases(40, 64) == 0
    # fewer slots: the backward pass chooses between advancing and reversing
    assert _cases(40, 39) >= 1


def test_phase_two_of_the_online_schedule_is_a_select_or_left_out(monkeypatch):
    # few slots: phase 2's update is computed and selected, no conditional
    assert _cases(16, 4) == 1  # the backward pass's choice only
    assert _cases(None, 4) == 1
    # many slots: phase 2 under a conditional in the forward loop, except where
    # phase 1 covers `max_steps` (4 slots: (4 + 1)(4 + 2) / 2 = 15 steps)
    monkeypatch.setattr(_online_schedule, "_ALWAYS_BOTH", 0)
    assert _cases(15, 4) == 1
    assert _cases(16, 4) == 2
    assert _cases(None, 4) == 2


@pytest.mark.parametrize("n", [1, 7, 12])
def test_every_state_kept_gradients_equal_a_plain_scans(n):
    w, y0 = jnp.asarray(0.9), jnp.linspace(-1.0, 1.0, 3)
    got = _checkpointed_grad(w, y0, n, 12, 12)
    want = _scanned_grad(w, y0, n)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=2e-5, atol=1e-6)
    assert _recomputations(n, 12, 12) == 0


def test_every_state_kept_under_vmap_stops_each_loop_at_its_own_length():
    # batch elements that have reversed all their steps keep their cotangents
    w, y0 = jnp.asarray(0.9), jnp.linspace(-1.0, 1.0, 3)
    ns = jnp.array([1, 7, 12])
    grad = jax.grad(_checkpointed, argnums=(0, 1))
    got = jax.jit(jax.vmap(grad, (None, None, 0, None, None)), static_argnums=(3, 4))(
        w, y0, ns, 12, 12
    )
    for k, n in enumerate([1, 7, 12]):
        want = _scanned_grad(w, y0, n)
        for g, v in zip(got, want):
            np.testing.assert_allclose(g[k], v, rtol=2e-5, atol=1e-6)


# --- recomputations against the optimum ---------------------------------------------


@functools.cache
def _optimal(length, slots):
    """The fewest steps advanced to reverse `length` steps from a stored state
    with `slots` slots (that state's included), choosing where to store offline."""
    if length <= 1:
        return 0
    if slots == 1:
        return length * (length - 1) // 2
    return min(
        m + _optimal(length - m, slots - 1) + _optimal(m, slots)
        for m in range(1, length)
    )


_RUNS = []  # one entry per run of the body of `_recomputing_grad`'s loop


@functools.cache
def _recomputing_grad(c, max_steps):
    """`grad(y0, n)` of `n` steps of `y <- y cos(y) + 1`, each run of the body
    recorded in `_RUNS`. Shared: compiled once per `(c, max_steps)` (`n`, the
    loop's length, is an argument)."""

    def body(carry):
        i, y = carry
        jax.debug.callback(lambda: _RUNS.append(None))
        return i + 1, y * jnp.cos(y) + 1.0

    def f(y0, n):
        init = (0, y0)
        return while_loop(lambda carry: carry[0] < n, body, init,
                          kind="checkpointed", checkpoints=c, max_steps=max_steps)[1]  # fmt: skip

    return jax.jit(jax.grad(f))


def _recomputations(n, c, max_steps):
    """Body runs of the backward pass beyond the `n` that are pulled back."""
    _RUNS.clear()
    jax.block_until_ready(_recomputing_grad(c, max_steps)(0.3, n))
    return len(_RUNS) - 2 * n  # the forward pass runs each step once


# (n, c): recomputations of the online schedule (the table in
# src/boxwood/internal/README.md), and of the optimal offline one.
_TABLE = [
    (6, 2, 5, 3), (8, 2, 11, 7), (20, 2, 60, 46),
    (15, 4, 12, 10), (30, 4, 54, 40), (60, 4, 149, 125),
    (45, 8, 38, 36), (100, 8, 199, 146),
]  # fmt: skip


@pytest.mark.parametrize("n, c, ours, optimal", _TABLE)
def test_recomputations_against_the_optimal_schedule(n, c, ours, optimal):
    assert _optimal(n, c) - (n - 1) == optimal  # the first sweep is the forward pass
    assert _recomputations(n, c, None) == ours
    assert _recomputations(n, c, n) == ours  # `max_steps` changes nothing here
    assert ours >= optimal


# --- an unbatched loop selects nothing ----------------------------------------------


def _buffered_loss(x, n):
    def body(carry):
        i, y, buf = carry
        return i + 1, jnp.tanh(x * y + 0.1), buf.at[i].set(y[0])

    init = (0, jnp.ones(3), jnp.zeros(40))
    out = while_loop(lambda c: c[0] < n, body, init, kind="checkpointed",
                     max_steps=40, checkpoints=4, buffers=lambda c: c[2])  # fmt: skip
    return out[1].sum() + out[2].sum()


def test_an_unbatched_loop_neither_selects_its_carry_nor_gates_its_writes():
    # Without `vmap` the body runs only while the condition holds: the selects
    # and write gates that a batch of loops of different lengths needs fold away
    # (2 selects remain: the loop's own `max_steps` bound and the buffer write's
    # bounds check), and the condition is evaluated once per step.
    compiled = jax.jit(_buffered_loss).lower(0.7, 37).compile().as_text()
    assert compiled.count(" select(") <= 2
    assert compiled.count(" compare(") <= 6


def test_batched_loops_of_different_lengths_still_stop_each_at_its_own():
    ns = jnp.array([3, 5, 37])
    grad = jax.jit(jax.grad(_buffered_loss))  # one compile for every length
    want = [grad(0.7, n) for n in ns]
    got = jax.jit(jax.vmap(jax.grad(_buffered_loss)))(jnp.full(3, 0.7), ns)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    values = jax.jit(jax.vmap(_buffered_loss))(jnp.full(3, 0.7), ns)  # no gradient
    one = jax.jit(_buffered_loss)
    np.testing.assert_allclose(values, [one(0.7, n) for n in ns], rtol=1e-6)
    # batched only along an outer `vmap`: the inner one sees one length
    nested = jax.vmap(jax.vmap(jax.grad(_buffered_loss), (0, None)), (None, 0))
    got = jax.jit(nested)(jnp.full(2, 0.7), jnp.array([3, 37]))
    np.testing.assert_allclose(got, [[want[0]] * 2, [want[2]] * 2], rtol=1e-6)
