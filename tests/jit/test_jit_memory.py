"""What `filter_jit` keeps alive over many calls: models passed in die once dropped,
resident memory stays flat, and the cache grows with the number of distinct
signatures (not calls) until `clear_cache()` / `boxwood.clear_caches()` empties it.
Structure is measured (weak references, cache entries), never time."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np

import boxwood as bw
from boxwood._module import _flat_key

SIZE = 4096  # floats per model: a leak of a few thousand models shows in RSS


class Model(bw.Module):
    w: jax.Array
    b: jax.Array
    tag: object = bw.field(static=True, default="model")

    def __call__(self, x):
        return jnp.sum(self.w * x) + self.b


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _store(wrapper):
    return wrapper._boxwood_jit._store


def test_thousands_of_fresh_models_leave_nothing_behind():
    apply = bw.filter_jit(lambda m, x: m(x))
    x = jnp.float32(2.0)
    # 64 KiB per model, so that 2,500 leaked models show in RSS as 10,000 of
    # `SIZE` would (the values stay below 2**24: their float32 sum is exact)
    base = np.arange(4 * SIZE, dtype=np.float32) % 1024
    refs = []

    def run(n, keep_every):
        for i in range(n):
            model = Model(jnp.asarray(base), jnp.float32(i))
            out = apply(model, x)
            if i % keep_every == 0:
                refs.append(weakref.ref(model))
        return out

    run(50, 10**9)  # warm up allocators and caches
    gc.collect()
    before = rss_bytes()
    last = run(2_500, 250)
    gc.collect()
    grown = rss_bytes() - before
    assert float(last) == float(np.sum(base) * 2 + 2499)
    assert all(r() is None for r in refs), "an earlier model is still alive"
    # 2,500 leaked models would be 2,500 * 64 KiB = 160 MiB
    assert grown < 24 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB"
    store = _store(apply)
    assert len(store.plans) == 1 and len(store.plan_variants) == 1
    assert len(store.fast_plans) <= 1
    assert apply.cache_info().traces == 1


def test_a_training_loop_keeps_only_the_current_model():
    step = bw.filter_jit(lambda m, x: bw.tree_at(lambda t: t.b, m, m.b + m(x)))
    model = Model(jnp.zeros(SIZE), jnp.float32(0))
    refs = []
    for i in range(2000):
        model = step(model, jnp.float32(1e-3))
        if i % 200 == 0:
            refs.append(weakref.ref(model))
    gc.collect()
    alive = [r for r in refs if r() is not None]
    assert alive == [], f"{len(alive)} earlier models are alive"
    assert step.cache_info().traces == 1
    # the model that went through the fast path still reads back correctly
    np.testing.assert_allclose(float(model.b), 0.0)


class Config:
    """A static value with identity semantics, to watch with a weak reference."""

    def __init__(self, i):
        self.i = i

    def __hash__(self):
        return self.i

    def __eq__(self, other):
        return isinstance(other, Config) and other.i == self.i


N_STRUCTURES = 20


def test_many_structures_grow_the_cache_per_structure_until_cleared():
    apply = bw.filter_jit(lambda m, x: m(x))
    other = bw.filter_jit(lambda m: m.tag)
    x = jnp.float32(1.0)
    configs = [Config(i) for i in range(N_STRUCTURES)]
    # ten calls of each structure: its cold call, then remembered and warm ones
    for i in range(10 * N_STRUCTURES):
        model = Model(jnp.ones(3), jnp.float32(0), configs[i % N_STRUCTURES])
        apply(model, x)
        other(model)
    store = _store(apply)
    # one plan per distinct treedef, however many calls
    assert len(store.plans) == N_STRUCTURES == apply.cache_info().traces
    assert apply.cache_info().size == N_STRUCTURES
    refs = [weakref.ref(c) for c in configs]
    del configs, model

    apply.clear_cache()  # frees this wrapper's compiled code only
    assert apply.cache_info() == (0, 0, 0, 0)
    assert not store.plans and not store.fast_plans and not store.plan_variants
    gc.collect()
    assert any(r() is not None for r in refs)  # `other` still holds them

    bw.clear_caches()  # every wrapper
    gc.collect()
    assert other.cache_info().size == 0
    assert all(r() is None for r in refs), "a static value outlived clear_caches()"
    # and the wrappers still work afterwards
    assert float(apply(Model(jnp.ones(3), jnp.float32(1)), x)) == 4.0


def test_dict_key_orders_table_is_bounded():
    for i in range(3 * _flat_key._MAX_ORDERS):
        order = _flat_key._dict_order({f"k{i}": 1, "a": 2})
        assert order == tuple(sorted(("a", f"k{i}")))
    assert len(_flat_key._ORDERS) <= _flat_key._MAX_ORDERS
