"""The cases of `ecosystem.py`, run in a child process against whichever `equinox`
the child imported (the real one, or boxwood under that name). Public API only."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

SOLVE_STEPS = 4096


def _vector_field(eqx, width: int, seed: int = 0):
    class VectorField(eqx.Module):
        net: eqx.nn.MLP

        def __call__(self, t, y, args):
            return self.net(y)

    net = eqx.nn.MLP(
        in_size=4,
        out_size=4,
        width_size=width,
        depth=2,
        activation=jnp.tanh,
        key=jax.random.key(seed),
    )
    return VectorField(net)


def _adjoint(diffrax, name: str):
    return {
        "direct": diffrax.DirectAdjoint,
        "recursive": diffrax.RecursiveCheckpointAdjoint,
        "backsolve": diffrax.BacksolveAdjoint,
    }[name]()


def _solve(eqx, eqxi, diffrax, adjoint: str, inline: bool):
    def solve(vf, y0):
        field = vf if inline else eqxi.noinline(vf)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Dopri8(),
            t0=0.0,
            t1=1.0,
            dt0=0.05,
            y0=y0,
            stepsize_controller=diffrax.PIDController(rtol=1e-4, atol=1e-6),
            adjoint=_adjoint(diffrax, adjoint),
            max_steps=SOLVE_STEPS,
        )
        return jnp.sum(sol.ys**2)

    return solve


def _compile_seconds(eqx, eqxi, diffrax, inline: str, grad: str, adjoint: str):
    vf = _vector_field(eqx, width=64)
    params, static = eqx.partition(vf, eqx.is_array)
    solve = _solve(eqx, eqxi, diffrax, adjoint, inline == "inline")

    def loss(p, y0):
        return solve(eqx.combine(p, static), y0)

    fn = jax.grad(loss) if grad == "grad" else loss
    y0 = jnp.ones(4)
    start = time.perf_counter()
    jax.jit(fn).lower(params, y0).compile()
    return time.perf_counter() - start


def _per_call(call, batches: int = 7, target_s: float = 0.15) -> float:
    jax.block_until_ready(call())
    jax.block_until_ready(call())
    start = time.perf_counter()
    jax.block_until_ready(call())
    one = max(time.perf_counter() - start, 1e-6)
    n = max(1, min(2000, int(target_s / one)))
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        out = None
        for _ in range(n):
            out = call()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def _ode_call(eqx, eqxi, diffrax, width: int, grad: bool):
    vf = _vector_field(eqx, width=width)
    solve = _solve(eqx, eqxi, diffrax, "recursive", True)
    fn = eqx.filter_jit(eqx.filter_grad(solve) if grad else solve)
    y0 = jnp.ones(4)
    return lambda: fn(vf, y0)


def _newton_call(eqx, optimistix):
    key = jax.random.key(1)
    a = jax.random.normal(key, (32, 32)) / 32
    b = jnp.linspace(-1.0, 1.0, 32)

    def residual(y, args):
        a, b = args
        return jnp.tanh(a @ y) + y - b

    solver = optimistix.Newton(rtol=1e-5, atol=1e-5)
    fn = eqx.filter_jit(
        lambda y0, args: optimistix.root_find(residual, solver, y0, args).value
    )
    y0 = jnp.zeros(32)
    return lambda: fn(y0, (a, b))


def _lm_call(eqx, optimistix):
    ts = jnp.linspace(0.0, 3.0, 64)
    data = 2.0 * jnp.exp(-1.3 * ts) + 0.5

    def residuals(p, args):
        ts, data = args
        return p[0] * jnp.exp(-p[1] * ts) + p[2] - data

    solver = optimistix.LevenbergMarquardt(rtol=1e-6, atol=1e-6)
    fn = eqx.filter_jit(
        lambda p0, args: optimistix.least_squares(residuals, solver, p0, args).value
    )
    p0 = jnp.array([1.0, 1.0, 0.0])
    return lambda: fn(p0, (ts, data))


def _linear_call(eqx, lineax, which: str):
    key = jax.random.key(2)
    m = jax.random.normal(key, (64, 64))
    b = jnp.arange(64.0) / 64
    if which == "lu":
        solver = lineax.LU()
        matrix, tags = m + 8 * jnp.eye(64), ()
    else:
        solver = lineax.CG(rtol=1e-6, atol=1e-6)
        matrix, tags = m @ m.T / 64 + jnp.eye(64), lineax.positive_semidefinite_tag

    def solve(matrix, b):
        op = lineax.MatrixLinearOperator(matrix, tags)
        return lineax.linear_solve(op, b, solver).value

    fn = eqx.filter_jit(solve)
    return lambda: fn(matrix, b)


def run(case: str, eqx, eqxi, diffrax, lineax, optimistix) -> dict:
    """Run one case; return `{"seconds": ...}`."""
    kind, *rest = case.split(":")
    if kind == "compile":
        inline, grad, adjoint = rest
        return {"seconds": _compile_seconds(eqx, eqxi, diffrax, inline, grad, adjoint)}
    name = rest[0]
    if name in ("ode", "ode_grad"):
        call = _ode_call(eqx, eqxi, diffrax, int(rest[1]), name == "ode_grad")
    elif name == "newton":
        call = _newton_call(eqx, optimistix)
    elif name == "lm":
        call = _lm_call(eqx, optimistix)
    else:
        call = _linear_call(eqx, lineax, name)
    return {"seconds": _per_call(call)}
