"""lineax, optimistix and diffrax with boxwood.

- Replacement: in a subprocess (so that nothing leaks into the other tests, which
  also use the real Equinox), `equinox`, `equinox.nn`, `equinox.debug` and
  `equinox.internal` are pointed at boxwood before the libraries are imported under
  jaxtyping's import hook (runtime type checks with beartype, as their own test
  suites run); each library entry point is then checked against a reference.
- Coexistence: the libraries on the real Equinox, with boxwood modules passed to
  them, and Equinox modules passed to boxwood's transformations.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from _child_flags import child_env

# Optional: installed by the `test` extra, absent on a machine without a registry
# (the TPU machine); the whole file skips there.
diffrax = pytest.importorskip("diffrax")
eqx = pytest.importorskip("equinox")
pytest.importorskip("lineax")
optx = pytest.importorskip("optimistix")

_SRC = str(Path(bw.__file__).resolve().parent.parent)

_SCRIPT = textwrap.dedent(
    r"""
    import json, sys, traceback

    import boxwood, boxwood.debug, boxwood.internal, boxwood.nn

    sys.modules["equinox"] = boxwood
    sys.modules["equinox.nn"] = boxwood.nn
    sys.modules["equinox.debug"] = boxwood.debug
    sys.modules["equinox.internal"] = boxwood.internal

    import jaxtyping

    jaxtyping.install_import_hook(["lineax", "optimistix", "diffrax"], "beartype.beartype")
    import jax, jax.numpy as jnp, numpy as np

    results = {}

    def check(fn):
        try:
            fn()
        except BaseException:
            results[fn.__name__] = traceback.format_exc(limit=-8)
        else:
            results[fn.__name__] = "ok"
        return fn

    def close(a, b, tol=1e-4):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)

    @check
    def aliased():
        import diffrax, lineax

        assert issubclass(lineax.AbstractLinearOperator, boxwood.Module)
        assert issubclass(diffrax.AbstractSolver, boxwood.Module)

    @check
    def import_hook_active():
        import lineax

        # Under the hook, lineax's annotations are checked when called.
        try:
            lineax.MatrixLinearOperator(jnp.ones(3))  # 1-d: the annotation wants 2-d
        except Exception as e:
            assert "jaxtyping" in type(e).__module__ or "beartype" in type(e).__module__ or "Type-check" in str(e), repr(e)
        else:
            raise AssertionError("a badly typed argument was accepted")

    @check
    def lineax_pytree_operator():
        import lineax

        # y = (y1: f32[2], y2: f32[]) = A (x1: f32[2], x2: f32[])
        a11 = jnp.array([[4.0, 1.0], [0.5, 3.0]])
        a12 = jnp.array([1.0, -1.0])
        a21 = jnp.array([0.0, 2.0])
        a22 = jnp.array(5.0)
        out_struct = (jax.ShapeDtypeStruct((2,), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32))
        op = lineax.PyTreeLinearOperator(((a11, a12), (a21, a22)), out_struct)

        def solve(b1, b2):
            sol = lineax.linear_solve(op, (b1, b2), lineax.AutoLinearSolver(well_posed=True))
            return sol.value

        @jax.jit  # the references, in plain jax.numpy: one program, not op by op
        def reference(b1, b2):
            dense = jnp.block([[a11, a12[:, None]], [a21[None, :], a22[None, None]]])
            dense_solve = lambda v: jnp.linalg.solve(dense, jnp.append(v, b2))
            return dense_solve(b1), jax.grad(lambda v: dense_solve(v)[:2].sum())(b1)

        b = (jnp.array([1.0, 2.0]), jnp.array(3.0))
        want, want_g = reference(*b)
        x1, x2 = jax.jit(solve)(*b)
        close(np.append(np.asarray(x1), np.asarray(x2)), want)
        g = jax.grad(lambda b1: solve(b1, b[1])[0].sum())(b[0])
        close(g, want_g)
        batched = jax.vmap(solve, (0, None))(jnp.stack([b[0], 2 * b[0]]), b[1])
        close(batched[0][0], x1)

    @check
    def optimistix_root_find():
        import optimistix

        def fn(y, a):
            return y**3 - a

        def root(a):
            sol = optimistix.root_find(fn, optimistix.Newton(rtol=1e-6, atol=1e-6), jnp.array(1.0), args=a)
            return sol.value

        close(root(jnp.array(8.0)), 2.0)
        # implicit differentiation: d a^(1/3) / da = 1 / (3 a^(2/3))
        close(jax.grad(root)(jnp.array(8.0)), 1 / 12)

    @check
    def optimistix_least_squares():
        import optimistix

        xs = np.linspace(0.0, 1.0, 8, dtype=np.float32)  # NumPy: no eager programs
        ys = 3.0 * xs - 1.0 + 0.01 * np.sin(20 * xs)

        def residuals(p, _):
            return p["m"] * xs + p["c"] - ys

        solver = optimistix.LevenbergMarquardt(rtol=1e-8, atol=1e-8)
        sol = optimistix.least_squares(residuals, solver, {"m": jnp.array(0.0), "c": jnp.array(0.0)})
        m, c = np.polyfit(xs, ys, 1)
        close(sol.value["m"], m, 1e-3)
        close(sol.value["c"], c, 1e-3)

    @check
    def diffrax_adaptive_and_backprop():
        import diffrax

        term = diffrax.ODETerm(lambda t, y, a: -a * y)

        def final(a):
            sol = diffrax.diffeqsolve(
                term, diffrax.Tsit5(), 0.0, 1.0, 0.1, jnp.array([1.0, 2.0]), args=a,
                stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
            )
            return sol.ys[-1], sol.stats["num_accepted_steps"]

        a = jnp.array(0.7)
        y1, steps = jax.jit(final)(a)
        assert 3 < int(steps) < 100, steps  # adaptive: several steps, not 10 fixed
        close(y1, jnp.exp(-a) * jnp.array([1.0, 2.0]))
        close(jax.grad(lambda a: final(a)[0].sum())(a), -3.0 * jnp.exp(-a))

    @check
    def diffrax_adjoints_agree_on_closed_over_args():
        # The checkpointed loop (RecursiveCheckpointAdjoint) differentiates what its
        # body closes over (here `args`, through diffrax's inner loops and filter_jit
        # caches) as the unrolled one (DirectAdjoint) does.
        import diffrax
        import equinox as eqx

        def run(inexact, adjoint):
            y0, (a,) = inexact
            term = diffrax.ODETerm(
                lambda t, y, args: jnp.stack([args[0] * y[0] + args[1] * y[1], -0.1 * y[1]])
            )
            sol = diffrax.diffeqsolve(
                term, diffrax.Tsit5(), 0.3, 9.5, None, y0, (a, -1.0),
                stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
                saveat=diffrax.SaveAt(t1=True), adjoint=adjoint,
            )
            return jnp.sum(sol.ys)

        x = (jnp.array([0.9, 5.4]), (jnp.asarray(0.1),))
        grad = eqx.filter_jit(eqx.filter_grad(run))
        direct = grad(x, diffrax.DirectAdjoint())
        checkpointed = grad(x, diffrax.RecursiveCheckpointAdjoint())
        assert float(jnp.abs(direct[1][0])) > 1.0, direct
        close(checkpointed[1][0], direct[1][0], 1e-4)
        close(checkpointed[0], direct[0], 1e-4)

    print("RESULTS" + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def aliased_results():
    env = child_env(PYTHONPATH=os.pathsep.join([_SRC, *sys.path]), PYTEST_ADDOPTS=None)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS")]
    assert lines, f"the aliased run crashed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULTS") :])


@pytest.mark.parametrize(
    "name",
    [
        "aliased",
        "import_hook_active",
        "lineax_pytree_operator",
        "optimistix_root_find",
        "optimistix_least_squares",
        "diffrax_adaptive_and_backprop",
        "diffrax_adjoints_agree_on_closed_over_args",
    ],
)
def test_libraries_on_boxwood(aliased_results, name):
    assert aliased_results[name] == "ok", aliased_results[name]


# Coexistence: the libraries on the real Equinox.


def test_boxwood_mlp_as_diffrax_vector_field():
    mlp = bw.nn.MLP(2, 2, 8, 2, key=jax.random.key(0))

    class Field(bw.Module):
        net: bw.nn.MLP

        def __call__(self, t, y, args):
            return jnp.tanh(self.net(y))

    @bw.filter_jit
    @bw.filter_grad
    def loss(net):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(Field(net)),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.1,
            jnp.array([1.0, -1.0]),
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
        )
        return jnp.sum(sol.ys[-1] ** 2)

    grads = loss(mlp)
    assert isinstance(grads, bw.nn.MLP)
    w = grads.layers[0].weight
    assert (
        w.shape == (8, 2) and bool(jnp.all(jnp.isfinite(w))) and bool(jnp.any(w != 0))
    )

    # The same gradient by finite differences along one weight.
    def value(eps):
        net = bw.tree_at(
            lambda m: m.layers[0].weight, mlp, mlp.layers[0].weight.at[0, 0].add(eps)
        )
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(Field(net)), diffrax.Tsit5(), 0.0, 1.0, 0.01,
            jnp.array([1.0, -1.0]),
        )  # fmt: skip
        return float(jnp.sum(sol.ys[-1] ** 2))

    fd = (value(1e-2) - value(-1e-2)) / 2e-2
    np.testing.assert_allclose(float(w[0, 0]), fd, rtol=2e-2, atol=1e-4)


def test_optimistix_root_find_over_boxwood_module():
    class Point(bw.Module):
        x: jax.Array
        y: jax.Array

    def residual(p, target):
        return Point(p.x**2 + p.y - target[0], p.x - p.y - target[1])

    solver = optx.Newton(rtol=1e-6, atol=1e-6)
    sol = optx.root_find(
        residual,
        solver,
        Point(jnp.array(1.0), jnp.array(1.0)),
        args=jnp.array([6.0, 0.0]),
    )
    assert isinstance(sol.value, Point)
    np.testing.assert_allclose([sol.value.x, sol.value.y], [2.0, 2.0], rtol=1e-5)

    # a boxwood module as the function's parameters, differentiated through the solve
    layer = bw.nn.Linear(1, 1, key=jax.random.key(1))

    @bw.filter_grad
    def root_loss(layer):
        out = optx.root_find(
            lambda y, m: m(y) - 1.0, solver, jnp.array([0.3]), args=layer
        )
        return out.value.sum()

    g = root_loss(layer)
    w, b = layer.weight[0, 0], layer.bias[0]
    root = (1.0 - b) / w  # w * y + b = 1
    np.testing.assert_allclose(g.bias[0], -1 / w, rtol=1e-4)
    np.testing.assert_allclose(g.weight[0, 0], -root / w, rtol=1e-4)


def test_equinox_modules_through_boxwood_transformations():
    mlp = eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(2))
    x = jnp.arange(3.0)

    def loss(m, x):
        return jnp.sum(m(x) ** 2)

    out = bw.filter_jit(loss)(mlp, x)
    np.testing.assert_allclose(out, loss(mlp, x), rtol=1e-6)
    grads = bw.filter_jit(bw.filter_grad(loss))(mlp, x)
    want = eqx.filter_grad(loss)(mlp, x)
    assert isinstance(grads, eqx.nn.MLP)
    for g, w in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5)
    batched = bw.filter_vmap(lambda m, x: m(x), in_axes=(None, 0))(
        mlp, jnp.ones((5, 3))
    )
    assert batched.shape == (5, 1)
    ensemble = bw.filter_vmap(lambda k: eqx.nn.Linear(2, 2, key=k))(
        jax.random.split(jax.random.key(0), 3)
    )
    assert isinstance(ensemble, eqx.nn.Linear) and ensemble.weight.shape == (3, 2, 2)
