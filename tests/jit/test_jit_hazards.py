"""Hazards of the warm path: shared state kept consistent when threads retrace one
function at once, a write to one module slowing down only what rests on it, and
writes made with `object.__setattr__` seen by the next call."""

import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw


class Lin(bw.Module):
    w: jax.Array
    b: jax.Array

    def __call__(self, x):
        return self.w * x + self.b


def _lin(n=3):
    return Lin(jnp.ones(n), jnp.zeros(n))


def _warm(f, *args, times=3):
    out = None
    for _ in range(times):
        out = f(*args)
    return out


def _calls_without_waiting(f, *args) -> bool:
    """Whether a call of `f` completes while another thread holds its store's lock
    (the lock that only cold entries and calls during another thread's trace
    take)."""
    lock = f._boxwood_jit._store.lock
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    caller = threading.Thread(target=lambda: (f(*args), done.set()))
    caller.start()
    finished = done.wait(2)
    release.set()
    holder.join()
    caller.join()
    return finished


@pytest.fixture
def preempting_tracing_reads(monkeypatch):
    """Every read of a store's `tracing` counter lets other threads run, as a
    preemption between the read and the write of `tracing += 1` would."""
    from boxwood._jit._cache import Store

    member = Store.__dict__["tracing"]

    def read(store):
        value = member.__get__(store, Store)
        time.sleep(0)  # releases the GIL: another thread may run here
        return value

    monkeypatch.setattr(Store, "tracing", property(read, member.__set__))


@pytest.mark.usefixtures("preempting_tracing_reads")
def test_many_threads_retracing_at_once_leave_the_fast_path_open(count_flattens):
    model, x = _lin(), jnp.ones(3)

    @bw.filter_jit
    def f(m, x):
        return m(x).sum()

    _warm(f, model, x)
    shapes = list(range(4, 40))
    barrier = threading.Barrier(len(shapes))
    errors = []

    def retrace(n):
        try:
            barrier.wait(10)
            f(_lin(n), jnp.ones(n))  # a new shape: JAX traces inside the call
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=retrace, args=(n,)) for n in shapes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    store = f._boxwood_jit._store
    assert store.tracing == 0  # no trace in progress, whatever interleaving
    before = count_flattens["n"]
    for _ in range(3):
        f(model, x)
    assert count_flattens["n"] == before  # back on the fast path
    assert _calls_without_waiting(f, model, x)


def test_a_write_to_one_module_slows_down_only_what_rests_on_it(count_flattens):
    a, other = _lin(), _lin()
    x = jnp.ones(3)
    f = bw.filter_jit(lambda m, x: m(x))
    g = bw.filter_jit(lambda m, x: m(x) * 2)
    _warm(f, a, x)
    _warm(g, other, x)
    written = _lin()
    _warm(f, written, x)
    object.__setattr__(written, "w", jnp.full(3, 5.0))  # after construction
    np.testing.assert_allclose(f(written, x), 5.0)  # seen
    before = count_flattens["n"]
    for _ in range(3):
        f(a, x)
        g(other, x)
    assert count_flattens["n"] == before  # nothing else was invalidated
    _warm(f, written, x)
    before = count_flattens["n"]
    f(written, x)
    assert count_flattens["n"] == before  # the written module is fast again


def test_a_write_to_a_nested_module_is_seen_through_its_parent(count_flattens):
    class Outer(bw.Module):
        inner: Lin

        def __call__(self, x):
            return self.inner(x)

    outer, x = Outer(_lin()), jnp.ones(3)
    f = bw.filter_jit(lambda m, x: m(x))
    _warm(f, outer, x)
    object.__setattr__(outer.inner, "w", jnp.full(3, 7.0))
    np.testing.assert_allclose(f(outer, x), 7.0)
    np.testing.assert_allclose(_warm(f, outer, x), 7.0)


@pytest.mark.parametrize("route", ["positional", "keywords", "method", "output"])
def test_object_setattr_on_a_module_with_a_flat_form_is_seen(route):
    class Scale(bw.Module):
        w: jax.Array

        def __call__(self, x):
            return self.w * x

    x = jnp.ones(())
    seen = []
    if route == "output":  # a module returned by `filter_jit` (built lazily)
        make = bw.filter_jit(lambda w: Scale(w))
        m = make(jnp.zeros(()))
    else:
        m = Scale(jnp.zeros(()))
    if route == "method":
        f = bw.filter_jit(m.__call__)
        call = lambda: f(x)  # noqa: E731
    elif route == "keywords":
        f = bw.filter_jit(lambda m, x: m(x))
        call = lambda: f(m=m, x=x)  # noqa: E731
    else:
        f = bw.filter_jit(lambda m, x: m(x))
        call = lambda: f(m, x)  # noqa: E731
    for value in (0.0, 5.0, 10.0):
        object.__setattr__(m, "w", jnp.asarray(value))
        for _ in range(3):
            out = call()
        seen.append(float(out))
    assert seen == [0.0, 5.0, 10.0]  # as eager code gives


def test_a_static_write_to_a_bound_methods_module_is_seen():
    class Scaled(bw.Module):
        w: jax.Array
        k: float = bw.field(static=True, default=1.0)

        def __call__(self, x):
            return self.w * x * self.k

    m = Scaled(jnp.ones(()))
    f = bw.filter_jit(m.__call__)
    x = jnp.ones(())
    assert float(_warm(f, x)) == 1.0
    object.__setattr__(m, "k", 3.0)  # static: another structure
    assert float(_warm(f, x)) == 3.0
    object.__setattr__(m, "w", jnp.ones(()) * 2)
    assert float(_warm(f, x)) == 6.0
    assert f.cache_info().traces == 2


def test_what_rests_on_a_module_is_not_part_of_its_state():
    import copy
    import pickle

    from boxwood._module._flat_form import HOLDERS
    from boxwood._module._slots import instance_dict

    inner = _lin()

    class Outer(bw.Module):
        inner: Lin

    outer = Outer(inner)
    f = bw.filter_jit(lambda m: m.inner.w)
    _warm(f, outer)
    assert HOLDERS in instance_dict(inner)  # `outer`'s flat form rests on it
    assert HOLDERS not in vars(inner)
    for clone in (copy.copy(inner), pickle.loads(pickle.dumps(inner))):
        assert HOLDERS not in instance_dict(clone)
    np.testing.assert_array_equal(copy.deepcopy(outer).inner.w, inner.w)


def test_a_holder_list_does_not_grow_with_dead_holders():
    from boxwood._module._flat_form import HOLDERS
    from boxwood._module._slots import instance_dict

    class Outer(bw.Module):
        inner: Lin

    inner = _lin()
    f = bw.filter_jit(lambda m: m.inner.w)
    for _ in range(300):  # a new parent each time, seen twice, then dropped
        outer = Outer(inner)
        f(outer)
        f(outer)
    assert len(instance_dict(inner)[HOLDERS]) < 100
