import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood.internal import nondifferentiable, scan, while_loop
from boxwood.internal._buffers import _indexed_shape

KINDS = [("lax", {}), ("bounded", {"max_steps": 20}), ("checkpointed", {}),
         ("checkpointed", {"max_steps": 20, "checkpoints": 2})]  # fmt: skip


def _loop(x, n_steps, kind, options):
    """x -> x * sin(x) ... applied while the counter is below `n_steps`."""

    def body(carry):
        i, y, name = carry
        return i + 1, y * jnp.sin(x) + x, name

    out = while_loop(
        lambda c: c[0] < n_steps, body, (0, jnp.array([1.0, 2.0]), "tag"),
        kind=kind, **options,
    )  # fmt: skip
    assert out[2] == "tag"
    return jnp.sum(out[1])


def _unrolled(x, n_steps):
    y = jnp.array([1.0, 2.0])
    for _ in range(n_steps):
        y = y * jnp.sin(x) + x
    return jnp.sum(y)


@pytest.mark.parametrize("kind,options", KINDS)
def test_values_match_unrolled(kind, options):
    for n in (0, 1, 7):
        assert jnp.allclose(_loop(0.5, n, kind, options), _unrolled(0.5, n))


@pytest.mark.parametrize("kind,options", KINDS[1:])
def test_gradients_match_unrolled_loop(kind, options):
    # one program for every length (`n` is an argument: the loop's bound is traced)
    grad = jax.jit(jax.grad(lambda x, n: _loop(x, n, kind, options)))
    for n in (1, 5, 13):
        got = grad(0.7, n)
        want = jax.grad(_unrolled)(0.7, n)
        assert jnp.allclose(got, want, rtol=1e-5), (n, got, want)


def test_checkpointed_many_steps_few_checkpoints_and_int_carry():
    # 37 steps through 4 slots: the stored states are thinned several times.
    def f(w):
        def body(c):
            i, y = c
            return i + 1, jnp.tanh(w * y + 0.1 * i.astype(jnp.float32))

        return while_loop(lambda c: c[0] < 37, body, (0, jnp.ones(3)),
                          kind="checkpointed", checkpoints=4)[1].sum()  # fmt: skip

    def unrolled(w):
        y = jnp.ones(3)
        for i in range(37):
            y = jnp.tanh(w * y + 0.1 * i)
        return y.sum()

    # (equal to 1e-15 in float64; float32 rounding differs between the two orders)
    want = jax.grad(unrolled)(0.9)
    assert jnp.allclose(jax.jit(jax.grad(f))(0.9), want, rtol=1e-3)
    grads = jax.jit(jax.vmap(jax.grad(f)))(jnp.array([0.5, 0.9]))
    assert jnp.allclose(grads[1], want, rtol=1e-3)


def test_gradient_with_respect_to_initial_value_and_max_steps():
    def f(y0, kind):
        return while_loop(lambda y: y < 100.0, lambda y: y * 2.0, y0, kind=kind,
                          max_steps=3)  # fmt: skip

    for kind in ("bounded", "checkpointed"):
        assert f(1.0, kind) == 8.0  # stopped by max_steps
        assert jax.grad(f)(1.0, kind) == 8.0


def test_lax_kind_max_steps_and_errors():
    assert while_loop(lambda y: True, lambda y: y + 1, 0, kind="lax", max_steps=5) == 5
    with pytest.raises(ValueError, match="needs `max_steps=`"):
        while_loop(lambda y: True, lambda y: y, 0, kind="bounded")
    with pytest.raises(ValueError, match="`kind` must be one of"):
        while_loop(lambda y: True, lambda y: y, 0, kind="fast")
    with pytest.raises(ValueError, match=r"`checkpoints` must be an int >= 1; got 0"):
        while_loop(lambda y: True, lambda y: y, 0, kind="checkpointed", checkpoints=0)
    # An odd number (diffrax passes its stage count) is accepted, as in Equinox.
    f = lambda x: while_loop(  # noqa: E731
        lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * x), (0, x),
        kind="checkpointed", checkpoints=3, max_steps=7,
    )[1]  # fmt: skip
    assert jax.jit(jax.grad(f))(1.5) == pytest.approx(6 * 1.5**5)
    with pytest.raises(ValueError, match="non-negative int"):
        while_loop(lambda y: True, lambda y: y, 0, kind="lax", max_steps=-1)


def test_buffers_are_accepted():
    def body(c):
        i, buf = c
        return i + 1, buf.at[i].set(2.0 * i.astype(jnp.float32))

    out = while_loop(lambda c: c[0] < 3, body, (0, jnp.zeros(4)), kind="checkpointed",
                     buffers=lambda c: c[1], max_steps=4)  # fmt: skip
    assert out[1].tolist() == [0.0, 2.0, 4.0, 0.0]


@pytest.mark.parametrize(
    "index",
    [
        1,
        np.int32(2),
        jnp.asarray(3, jnp.uint8),
        (1, 2),
        slice(0, 2),
        jnp.array([0, 1]),
        (Ellipsis, 1),
        True,
    ],  # fmt: skip
)
def test_buffer_writes_broadcast_to_the_indexed_shape(index):
    want = jax.eval_shape(lambda: jnp.zeros((5, 3))[index]).shape
    assert _indexed_shape(jnp.zeros((5, 3)), index) == want


def test_a_buffer_row_write_traces_nothing_more(monkeypatch):
    # one row per step, the usual write, takes its shape from the buffer's
    def body(c):
        i, buf = c
        return i + 1, buf.at[i].set(1.0)

    def loop():
        return while_loop(lambda c: c[0] < 3, body, (0, jnp.zeros((4, 2))),
                          kind="checkpointed", buffers=lambda c: c[1], max_steps=4)  # fmt: skip

    closed = jax.make_jaxpr(loop)()  # a first trace, outside the patch
    calls = []
    real = jax.eval_shape
    monkeypatch.setattr(
        jax, "eval_shape", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    assert str(jax.make_jaxpr(loop)()) == str(closed)
    assert calls == []


@pytest.mark.parametrize("checkpoints", [None, 3, "all"])
def test_checkpointed_scan_matches_lax_scan(checkpoints):
    def f(w, kind):
        def step(c, x):
            c = jnp.tanh(w * c + x)
            return c, c * 2

        c, ys = scan(step, jnp.zeros(2), jnp.arange(10.0).reshape(5, 2) / 10,
                     kind=kind, checkpoints=checkpoints)  # fmt: skip
        return c.sum() + ys.sum()

    value = jax.jit(jax.value_and_grad(f), static_argnums=1)
    (got, got_grad), (want, want_grad) = value(0.3, "checkpointed"), value(0.3, "lax")
    assert jnp.allclose(got, want)
    assert jnp.allclose(got_grad, want_grad)
    with pytest.raises(ValueError, match="different lengths"):
        scan(lambda c, x: (c, x), 0.0, jnp.ones(3), length=4, kind="checkpointed")
    with pytest.raises(ValueError, match="'lax' or 'checkpointed'"):
        scan(lambda c, x: (c, x), 0.0, jnp.ones(3), kind="bounded")


def _nested(a, y0):
    def inner(y):
        def body(c):
            i, z = c
            return i + 1, z + 0.1 * a * z

        init = (0, y)
        return while_loop(
            lambda c: c[0] < 3,
            body,
            init,
            kind="checkpointed",
            max_steps=5,
            checkpoints=2,
        )[1]

    def body(c):
        i, y = c
        return i + 1, inner(y)

    init = (0, y0)
    out = while_loop(
        lambda c: c[0] < 4, body, init, kind="checkpointed", max_steps=6, checkpoints=2
    )
    return out[1].sum()


def _nested_unrolled(a, y0):
    y = y0
    for _ in range(12):
        y = y + 0.1 * a * y
    return y.sum()


@pytest.mark.parametrize(
    "wrap", [lambda f: f, jax.jit, bw.filter_jit], ids=["eager", "jit", "filter_jit"]
)
def test_nested_checkpointed_loops_differentiate_closed_over_values(wrap):
    # The inner loop's forward rule is traced first inside the outer loop's
    # perturbation analyses, and JAX reuses that trace when the outer loop pulls
    # cotangents back: the gradient with respect to `a` (closed over by the inner
    # body) must still arrive (it was 0.0).
    a, y0 = jnp.asarray(0.5), jnp.array([1.0, 2.0])
    got = wrap(jax.grad(_nested, argnums=(0, 1)))(a, y0)
    want = jax.grad(_nested_unrolled, argnums=(0, 1))(a, y0)
    assert jnp.allclose(got[0], want[0], rtol=1e-5) and float(want[0]) > 1.0
    assert jnp.allclose(got[1], want[1], rtol=1e-5)


@pytest.mark.parametrize(
    "wrap", [lambda f: f, jax.jit, bw.filter_jit], ids=["eager", "jit", "filter_jit"]
)
def test_checkpointed_loop_leaves_unperturbed_closed_over_values_alone(wrap):
    # A closed-over array that is not differentiated (diffrax's Brownian tree
    # marks its `t0` with `nondifferentiable`) is not differentiated by the loop.
    t0 = jnp.asarray(0.25)

    def f(y0):
        def body(c):
            i, y = c
            return i + 1, 0.9 * y + nondifferentiable(t0, name="t0")

        init = (0, y0)
        return while_loop(
            lambda c: c[0] < 5, body, init, kind="checkpointed", max_steps=8
        )[1].sum()

    got = wrap(jax.grad(f))(jnp.array([1.0, 2.0]))
    assert jnp.allclose(got, 0.9**5)
    with pytest.raises(RuntimeError, match="t0 cannot be differentiated"):
        jax.grad(lambda t: f(jnp.array([1.0, 2.0])) + nondifferentiable(t, name="t0"))(
            t0
        )


def _unperturbed_loop(x, y):
    # `fixed` never depends on `x` (the only perturbed input); `moved` starts
    # unperturbed but a step copies `x`'s value into it.
    def body(c):
        i, fixed, moved, follow = c
        return i + 1, fixed * 2.0, follow, follow * 1.5

    init = (0, y, jax.lax.stop_gradient(x), x)
    return while_loop(lambda c: c[0] < 3, body, init, kind="checkpointed", max_steps=4)


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_outputs_depending_on_no_perturbed_input_have_no_tangent(wrap):
    # `nondifferentiable` raises for any tangent that is not a symbolic zero: the
    # loop's outputs that no perturbed input reaches must carry none, those a
    # step makes perturbed must carry one.
    y = jax.lax.stop_gradient(jnp.asarray(1.0))

    def run(x):
        _, fixed, moved, follow = _unperturbed_loop(x, y)
        nondifferentiable(fixed, name="fixed")
        with pytest.raises(RuntimeError, match="moved cannot be differentiated"):
            nondifferentiable(moved, name="moved")
        return fixed + moved + follow

    jax.linearize(run, jnp.asarray(2.0))
    got = wrap(jax.grad(run))(jnp.asarray(2.0))
    assert jnp.allclose(got, 1.5**2 + 1.5**3)  # d(moved)/dx + d(follow)/dx


def test_unperturbed_outputs_under_vmap_of_grad():
    def loss(x, y):
        _, fixed, moved, follow = _unperturbed_loop(x, y)
        return fixed + moved + follow

    xs, ys = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 1.0, 1.5])
    got = jax.jit(jax.vmap(jax.grad(loss)))(xs, ys)
    assert jnp.allclose(got, jnp.full(3, 1.5**2 + 1.5**3))
    grads_y = jax.jit(jax.vmap(jax.grad(loss, argnums=1)))(xs, ys)
    assert jnp.allclose(grads_y, 8.0)  # fixed = y * 2**3


def test_unperturbed_outputs_of_a_vmapped_loop_inside_grad():
    # Loops of different lengths in one batch; the constant output has no tangent.
    def loop(x, n):
        def body(c):
            return c[0] + 1, c[1] * 1.5, c[2] * 2.0

        init = (0, x, jnp.ones_like(x))
        return while_loop(
            lambda c: c[0] < n, body, init, kind="checkpointed", max_steps=5
        )

    def loss(x):
        _, y, const = jax.vmap(loop)(x, jnp.array([1, 2, 3]))
        nondifferentiable(const, name="const")
        return y.sum()

    xs = jnp.array([1.0, 2.0, 3.0])
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
        assert jnp.allclose(grad(xs), jnp.array([1.5, 1.5**2, 1.5**3]))
