"""Several threads training through one `filter_jit` wrapper: the results match a
serial run, each signature is traced once, and nothing deadlocks (every join is
bounded by a timeout). Run on both call paths (`call_path`)."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

pytestmark = pytest.mark.usefixtures("call_path")

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
