"""`boxwood.internal.noinline`: the function is compiled once, as its own
executable, called from every call site; its transforms give the same results as
the function itself."""

import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.internal as bwi
from _child_flags import child_env, xla_flags_with_devices
from _precision import tolerance


def _body(x):
    for _ in range(5):
        x = jnp.sin(x) * 1.5 + jnp.cos(x)
    return x


def test_body_is_not_compiled_into_the_caller():
    traces = []

    def fn(x):
        traces.append(1)
        return _body(x)

    wrapped = bwi.noinline(fn)

    @jax.jit
    def caller(x):
        return wrapped(x) + wrapped(2 * x) + wrapped(3 * x) + wrapped(4 * x)

    x = jnp.linspace(0.0, 1.0, 3)
    expected = sum(_body(k * x) for k in (1, 2, 3, 4))
    np.testing.assert_allclose(caller(x), expected, rtol=1e-5)
    # one trace for the output's shapes, one for the function's executable,
    # whatever the number of call sites
    assert len(traces) == 2
    hlo = caller.lower(x).compile().as_text() or ""
    assert "sine" not in hlo and "cosine" not in hlo

    @jax.jit
    def other_caller(x):
        return wrapped(x) * 2

    np.testing.assert_allclose(other_caller(x), 2 * _body(x), rtol=1e-5)
    assert len(traces) == 2  # the same executable serves another caller


def test_inside_a_compiled_caller_the_body_runs_on_the_host_cpu():
    # The caller holds its device until the callback returns: a TPU, which runs
    # one program at a time, would wait for itself if the body ran there.
    devices = []

    def fn(x):
        devices.append(jax.config.jax_default_device)
        return jnp.sin(x)

    wrapped = bwi.noinline(fn)
    x = jnp.arange(3.0)
    np.testing.assert_allclose(jax.jit(wrapped)(x), np.sin(np.arange(3.0)), rtol=1e-6)
    # the trace for the output's shapes, then the executable's, in the callback
    assert devices == [None, jax.local_devices(backend="cpu")[0]]


@pytest.fixture
def without_cpu_backend(monkeypatch):
    """JAX_PLATFORMS naming accelerators only: JAX has no CPU backend to name."""
    from boxwood.internal import _noinline

    def no_cpu(backend=None):
        raise RuntimeError(f"Unknown backend {backend}. Available backends are []")

    monkeypatch.setattr(jax, "local_devices", no_cpu)
    _noinline._host_cpu.cache_clear()
    yield _noinline
    _noinline._host_cpu.cache_clear()


@pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="on a TPU the body cannot run on the default device (the next test)",
)
def test_without_a_cpu_backend_the_body_runs_on_the_default_device(without_cpu_backend):
    wrapped = bwi.noinline(lambda x: jnp.cos(x) + 1.0)
    np.testing.assert_allclose(jax.jit(wrapped)(jnp.zeros(2)), [2.0, 2.0])
    assert without_cpu_backend._host_cpu() is None


def test_on_a_tpu_without_a_cpu_backend_a_compiled_call_says_what_to_do(
    without_cpu_backend, monkeypatch
):
    # the callback cannot run the body on the TPU that waits for it (it hung
    # there), so compiling the call fails and says how to add the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    wrapped = bwi.noinline(lambda x: jnp.cos(x) + 1.0)
    np.testing.assert_allclose(wrapped(jnp.zeros(2)), [2.0, 2.0])  # eager: fine
    with pytest.raises(RuntimeError, match="add cpu to JAX_PLATFORMS"):
        jax.jit(wrapped)(jnp.zeros(2))


def test_wrappers_sharing_abstract_fn_do_not_retrace_the_caller():
    traces = {"f": 0, "g": 0, "caller": 0}

    def abstract(_, x, y):
        return jnp.broadcast_arrays(x, y)[0]

    def f(x, y):
        traces["f"] += 1
        return x + y

    def g(x, y):
        traces["g"] += 1
        return x * y

    wf, wg = bwi.noinline(f, abstract), bwi.noinline(g, abstract)
    assert jax.tree_util.tree_structure(wf) == jax.tree_util.tree_structure(wg)

    @jax.jit
    def caller(fn, x, y):
        traces["caller"] += 1
        return fn(x, y)

    assert caller(wf, 2.0, 3.0) == 5.0
    assert caller(wg, 2.0, 3.0) == 6.0
    assert caller(wf, 4.0, 3.0) == 7.0
    assert traces == {"f": 1, "g": 1, "caller": 1}


class _Affine(bw.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x, *, power=2):
        y = jnp.tanh(self.weight @ x + self.bias) ** power
        return {"y": y, "count": jnp.sum(x > 0), "power": power}


def _model():
    weight = jnp.array([[0.5, -1.0, 0.3], [0.2, 0.4, -0.7]])
    return _Affine(weight, jnp.array([0.1, -0.2]))


def _loss(call, model, x):
    out = call(model, x)
    return jnp.sum(out["y"] * x[:2]) + out["count"].astype(x.dtype)


def _direct(model, x):
    return model(x, power=3)


def _wrapped(model, x):
    return bwi.noinline(model)(x, power=3)


@functools.cache
def _inputs():
    # concrete arrays even where the first call is inside a `jax.jit` trace (they
    # are cached: a tracer would outlive its trace)
    with jax.ensure_compile_time_eval():
        x = jnp.array([0.3, -0.8, 1.1])
        return _model(), x, jnp.stack([x, 2 * x, -x], axis=1)  # batched on axis 1


# Each case calls `c`, the function (`_direct`) or its wrapper (`_wrapped`).
_CASES = {
    "call": lambda c, model, x, xs: c(model, x)["y"],
    "jvp": lambda c, model, x, xs: jax.jvp(lambda v: c(model, v)["y"], (x,), (x + 1,)),
    "grad_x": lambda c, model, x, xs: jax.grad(lambda v: _loss(c, model, v))(x),
    "grad_fn": lambda c, model, x, xs: bw.filter_grad(lambda m: _loss(c, m, x))(model),
    "hessian": lambda c, model, x, xs: jax.hessian(lambda v: _loss(c, model, v))(x),
    "vmap": lambda c, model, x, xs: jax.vmap(lambda v: c(model, v)["y"], 1)(xs),
    "vmap_grad": lambda c, model, x, xs: jax.vmap(
        jax.grad(lambda v: _loss(c, model, v)), 1
    )(xs),
    "grad_vmap": lambda c, model, x, xs: jax.grad(
        lambda v: jnp.sum(jax.vmap(lambda u: c(model, u)["y"], 1)(v) ** 2)
    )(xs),
}


def _case(name, c):
    """Case `name` with `c`, its inputs closed over (constants under `jax.jit`)."""
    return _CASES[name](c, *_inputs())


_case_jit = jax.jit(_case, static_argnums=(0, 1))


@functools.cache
def _expected(name):
    """The function's own result for case `name`, compiled: one program per case,
    shared by both parametrisations (run eagerly, each of its operations would
    compile on its own, about 120 programs for the eight cases)."""
    return _case_jit(name, _direct)


@pytest.mark.parametrize("jit", [False, True])
def test_transforms_match_the_function(jit):
    # `_expected` folds its constants on the host; eagerly (jit=False) the wrapped
    # calls run on the device, whose float32 `tanh` is good to a few ulps only
    # (a TPU v5e: 3.9e-5 relative on the cube of one). A gradient sums terms of
    # order one, so an entry near cancellation keeps that error in absolute terms
    # (vmap_grad there: 0.14741 against 0.14737)
    rtol = tolerance(cpu=1e-5, accelerator=1e-4)
    atol = tolerance(cpu=1e-6, accelerator=1e-4)
    for name in _CASES:
        got = _case_jit(name, _wrapped) if jit else _case(name, _wrapped)
        expected = _expected(name)
        for e, g in zip(
            jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)
        ):
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=name)
    model, x, _ = _inputs()
    out = _wrapped(model, x)
    assert out["power"] == 3 and out["count"].dtype == jnp.int32


def test_vmap_over_the_wrapper_itself_is_refused():
    wrapped = bwi.noinline(lambda x: x + 1)
    stacked = jax.tree_util.tree_map(lambda leaf: np.stack([leaf, leaf]), wrapped)
    with pytest.raises(ValueError, match="ticket leaf"):
        jax.vmap(lambda f, x: f(x))(stacked, jnp.ones(2))


def test_wrong_abstract_fn_is_reported():
    wrapped = bwi.noinline(lambda x: (x, x), abstract_fn=lambda _, x: x)
    with pytest.raises(ValueError, match="abstract evaluation gave"):
        wrapped(jnp.ones(2))


def test_changed_ticket_is_reported():
    wrapped = bwi.noinline(lambda x: x + 1)
    broken = bw.tree_at(lambda w: w.ticket, wrapped, np.array(10**8, dtype=np.int32))
    with pytest.raises(ValueError, match="not the ticket of a wrapped function"):
        broken(jnp.ones(2))


def test_direct_transpose_is_refused():
    wrapped = bwi.noinline(jnp.sin)
    with pytest.raises(NotImplementedError, match="transposed directly"):
        jax.linear_transpose(wrapped, jnp.ones(2))(jnp.ones(2))


_SHARDED = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
import boxwood.internal as bwi

wrapped = bwi.noinline(lambda x: jnp.sin(x) * 2)
mesh = jax.make_mesh((2,), ("d",))
x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec("d")))
out = jax.jit(lambda v: wrapped(v) + 1)(x)
np.testing.assert_allclose(out, np.sin(np.arange(8.0)) * 2 + 1, rtol=1e-6)
print("ok", len(jax.devices()))
"""


def test_program_over_several_devices():
    env = child_env(XLA_FLAGS=xla_flags_with_devices(2))  # simulated devices
    done = subprocess.run(
        [sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "2"]
