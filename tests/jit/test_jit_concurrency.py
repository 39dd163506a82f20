"""Several threads training through one `filter_jit` wrapper: the results match a
serial run, each signature is traced once, and nothing deadlocks (every join is
bounded by a timeout)."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

N_THREADS = 8
STEPS = 15
TIMEOUT = 120  # seconds; only reached on a deadlock


class Layer(bw.Module):
    w: jax.Array
    b: jax.Array

    def __call__(self, x):
        return jnp.tanh(x @ self.w + self.b)


class Net(bw.Module):
    layers: tuple
    scale: float = bw.field(static=True, default=1.0)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.scale * jnp.sum(x)


def make_net(seed, width=3, depth=1, scale=1.0):
    keys = jax.random.split(jax.random.key(seed), depth)
    layers = tuple(
        Layer(
            jax.random.normal(k, (width, width)) / width,
            jnp.full((width,), 0.1 * seed),
        )
        for k in keys
    )
    return Net(layers, scale)


def loss(net, x):
    return (net(x) - 1.0) ** 2


def step_fn(net, x):
    grads = bw.filter_grad(loss)(net, x)
    return bw.apply_updates(net, jax.tree_util.tree_map(lambda g: -0.1 * g, grads))


def make_step(max_traces=None):
    """A fresh wrapper with its own cache; `assert_max_traces` counts the traces of
    the Python function itself (and raises past `max_traces`)."""
    return bw.filter_jit(bw.debug.assert_max_traces(step_fn, max_traces=max_traces))


def train(step, net, x):
    for _ in range(STEPS):
        net = step(net, x)
    return net


def run_threads(step, nets, xs):
    """Train `nets[i]` on `xs[i]` in thread `i`, all starting together."""
    results = [None] * len(nets)
    errors = []
    barrier = threading.Barrier(len(nets))

    def work(i):
        try:
            barrier.wait(timeout=TIMEOUT)
            results[i] = train(step, nets[i], xs[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(nets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock?)"
    if errors:
        raise errors[0]
    return results


def assert_same_models(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def serial(nets, xs):
    step = make_step()
    return [train(step, net, x) for net, x in zip(nets, xs)]


def test_eight_models_of_one_structure_trace_once():
    nets = [make_net(seed) for seed in range(N_THREADS)]
    xs = [jnp.full((3,), 0.1 * i) for i in range(N_THREADS)]
    step = make_step(max_traces=1)
    results = run_threads(step, nets, xs)
    for got, want in zip(results, serial(nets, xs)):
        assert_same_models(got, want)
    info = step.cache_info()
    assert info.traces == 1 and info.misses == 1, info
    assert info.hits == N_THREADS * STEPS - 1, info
    assert bw.debug.get_num_traces(step) == 1


def test_eight_structures_trace_once_each():
    # two widths x two depths x two static scales: eight signatures, one per thread
    shapes = [(w, d, s) for w in (2, 3) for d in (1, 2) for s in (1.0, 0.5)]
    nets = [make_net(i, w, d, s) for i, (w, d, s) in enumerate(shapes)]
    xs = [jnp.full((w,), 0.2) for (w, _, _) in shapes]
    step = make_step(max_traces=N_THREADS)
    results = run_threads(step, nets, xs)
    for got, want in zip(results, serial(nets, xs)):
        assert_same_models(got, want)
    info = step.cache_info()
    assert info.traces == len(set(shapes)) == N_THREADS, info
    assert bw.debug.get_num_traces(step) == N_THREADS
    assert info.misses == N_THREADS and info.hits == N_THREADS * (STEPS - 1), info


def test_threads_racing_on_one_new_signature_trace_it_once():
    # every thread makes the very first call with the same new signature at once
    step = make_step(max_traces=1)
    nets = [make_net(0) for _ in range(N_THREADS)]
    x = jnp.ones(3)
    results = run_threads(step, nets, [x] * N_THREADS)
    for got in results[1:]:
        assert_same_models(got, results[0])
    assert step.cache_info().traces == 1


def test_an_error_in_one_thread_does_not_block_the_others():
    step = make_step()
    good = [make_net(i) for i in range(N_THREADS - 1)]
    xs = [jnp.ones(3)] * (N_THREADS - 1) + [jnp.ones(4)]  # the last: wrong shape
    nets = [*good, make_net(99)]
    with pytest.raises(TypeError, match="dot_general|incompatible|shape"):
        run_threads(step, nets, xs)
    # the wrapper still works afterwards, from any thread
    results = run_threads(step, good, xs[:-1])
    for got, want in zip(results, serial(good, xs[:-1])):
        assert_same_models(got, want)


class _Gate:
    """A pytree node whose unflatten, armed, blocks the first trace that reaches it
    (before `filter_jit`'s trace bookkeeping runs)."""

    armed = False
    entered = threading.Event()
    release = threading.Event()

    def __init__(self, value):
        self.value = value


SHORT = 20  # seconds: a deadlock below fails the test after this long


def _gate_unflatten(aux, children):
    (value,) = children
    if _Gate.armed and isinstance(value, jax.core.Tracer):
        _Gate.armed = False
        _Gate.entered.set()
        _Gate.release.wait(SHORT)
    return _Gate(value)


jax.tree_util.register_pytree_node(_Gate, lambda g: ((g.value,), None), _gate_unflatten)


def test_a_trace_in_progress_and_a_locked_first_call_do_not_deadlock():
    # Thread Y traces a new shape of a warm entry without boxwood's lock and stops
    # in the middle of JAX's trace; thread Z traces another entry (so a trace is in
    # progress); thread X then calls Y's signature: JAX makes it wait for Y's trace
    # while X holds boxwood's lock, so Y's trace must not need that lock.
    z_in, z_release = threading.Event(), threading.Event()

    @bw.filter_jit
    def f(gate, x, flag):
        if flag and x.shape == (3,):
            z_in.set()
            z_release.wait(SHORT)
        return gate.value * x

    g2, x2 = _Gate(jnp.ones(2)), jnp.ones(2)
    g3, x3 = _Gate(jnp.ones(3)), jnp.ones(3)
    f(g2, x2, False), f(g2, x2, True)  # both entries warm (shape 2)
    _Gate.entered.clear()
    _Gate.release.clear()
    _Gate.armed = True
    results = {}

    def run(name, flag):
        results[name] = f(g3, x3, flag)

    threads = {
        "y": threading.Thread(target=run, args=("y", False), daemon=True),
        "z": threading.Thread(target=run, args=("z", True), daemon=True),
        "x": threading.Thread(target=run, args=("x", False), daemon=True),
    }
    try:
        threads["y"].start()
        assert _Gate.entered.wait(SHORT)  # Y is inside JAX's trace
        threads["z"].start()
        assert z_in.wait(SHORT)  # Z's trace is in progress
        threads["x"].start()
        threads["x"].join(1.0)  # X waits on Y's trace in JAX
    finally:
        _Gate.release.set()
        z_release.set()
    for t in threads.values():
        t.join(SHORT)
    assert not any(t.is_alive() for t in threads.values()), "deadlock"
    for name in "yzx":
        assert results[name].tolist() == [1.0, 1.0, 1.0]
    assert f.cache_info().traces == 4
