"""What `filter_jit` keeps alive, and its process-wide registries stay bounded."""

import gc
import weakref

import jax
import jax.numpy as jnp

import boxwood as bw
from boxwood._jit import _cache


class Config:
    """A static field value: hashable, compared by type."""

    def __hash__(self):
        return 1

    def __eq__(self, other):
        return isinstance(other, Config)


class Scaled(bw.Module):
    w: jax.Array
    config: object = bw.field(static=True)

    def __call__(self, x):
        return self.w * x


def _train_and_drop():
    config = Config()
    model = Scaled(jnp.ones(2), config)
    step = bw.filter_jit(lambda m, x: (m, m(x)))
    for _ in range(3):  # the returned model carries its flat form (structure token)
        model, _ = step(model, jnp.ones(2))
    apply = bw.filter_jit(model)
    apply(jnp.ones(2))
    apply(jnp.ones(2))
    return weakref.ref(config)


def test_static_values_die_with_the_model_and_wrappers():
    ref = _train_and_drop()
    gc.collect()
    assert ref() is None


def test_wrap_site_registry_is_bounded_and_holds_no_code(monkeypatch):
    monkeypatch.setattr(_cache, "_WRAPS_AT_SITE", type(_cache._WRAPS_AT_SITE)())
    for i in range(_cache._MAX_SITES + 20):
        namespace = {}
        exec(f"def f{i}(x):\n    return x\n", namespace)  # distinct code objects
        bw.filter_jit(namespace[f"f{i}"])
    assert len(_cache._WRAPS_AT_SITE) <= _cache._MAX_SITES
    for key in _cache._WRAPS_AT_SITE:
        assert not any(isinstance(part, type((lambda: 0).__code__)) for part in key)
