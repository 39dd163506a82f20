"""The identity cache of modules' flat forms (`boxwood._flat_cache`)."""

import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw
import boxwood._jit as jit_module
from boxwood._flat_cache import RECORDS


class Lin(bw.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(self.weight @ x + self.bias)


class Net(bw.Module):
    layers: tuple

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class ListNet(bw.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def net(cls=Net, n=2, scale=1.0):
    layers = [Lin(jnp.eye(3) * scale, jnp.zeros(3)) for _ in range(n)]
    return cls(tuple(layers) if cls is Net else layers)


@pytest.fixture
def count_flattens(monkeypatch):
    calls = {"n": 0}
    real = jit_module._flatten

    def counting(tree, *a, **k):
        calls["n"] += 1
        return real(tree, *a, **k)

    monkeypatch.setattr(jit_module, "_flatten", counting)
    return calls


def test_repeated_module_argument_is_not_reflattened(count_flattens):
    f = bw.filter_jit(lambda m, x: m(x))
    model = net()
    for i in range(2):  # first sight, then remembered
        f(model, jnp.full(3, float(i)))
    before = count_flattens["n"]
    for i in range(5):
        out = f(model, jnp.full(3, float(i)))
        assert jnp.allclose(out, model(jnp.full(3, float(i))))
    assert count_flattens["n"] == before
    assert f.cache_info().traces == 1 and f.cache_info().hits == 6


def test_new_model_objects_take_the_flatten_path_and_stay_correct(count_flattens):
    f = bw.filter_jit(lambda m, x: m(x))
    model = net()
    f(model, jnp.ones(3))
    f(model, jnp.ones(3))
    other = net(scale=2.0)  # same structure, other arrays, other object
    before = count_flattens["n"]
    assert jnp.allclose(f(other, jnp.ones(3)), other(jnp.ones(3)))
    assert count_flattens["n"] == before + 1
    changed = bw.tree_at(lambda m: m.layers[0].bias, model, jnp.ones(3))
    assert jnp.allclose(f(changed, jnp.ones(3)), changed(jnp.ones(3)))


def test_modules_holding_lists_are_always_flattened(count_flattens):
    f = bw.filter_jit(lambda m, x: m(x))
    model = net(ListNet)
    f(model, jnp.ones(3))  # compiles (the trace flattens the output too)
    before = count_flattens["n"]
    for _ in range(3):
        f(model, jnp.ones(3))
    assert count_flattens["n"] == before + 3
    model.layers.append(Lin(jnp.eye(3) * 3, jnp.zeros(3)))  # mutated in place
    assert jnp.allclose(f(model, jnp.ones(3)), model(jnp.ones(3)))


def test_records_die_with_their_module():
    f = bw.filter_jit(lambda m, x: m(x))
    model = net()
    f(model, jnp.ones(3))
    f(model, jnp.ones(3))
    assert id(model) in RECORDS
    ref, key = weakref.ref(model), id(model)
    del model
    gc.collect()
    assert ref() is None and key not in RECORDS
