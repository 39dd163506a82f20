"""Typed PRNG keys (`jax.random.key`, JAX's recommended kind) take `filter_jit`'s
fast path like any array: as an argument, inside containers and keyword arguments,
held by a module, and returned by one step to the next. (They are not
`jax.Array`'s concrete class, and used to send every call to the slow path.)"""

import jax
import jax.numpy as jnp

import boxwood as bw
from boxwood import nn


class Noisy(bw.Module):
    linear: nn.Linear
    key: jax.Array  # a typed key held by the module

    def __call__(self, x):
        return self.linear(x) + jax.random.normal(self.key, x.shape)


def _model():
    k1, k2 = bw.random.split_keys(jax.random.key(0))
    return Noisy(nn.Linear(3, 3, key=k1), k2)


def test_a_key_argument_is_walked(request):
    model = nn.Linear(3, 3, key=jax.random.key(1))

    @bw.filter_jit
    def f(model, x, key, pair):
        a, b = pair
        return model(x) + jax.random.normal(key, (3,)) + jax.random.uniform(a, (3,))

    x = jnp.ones(3)
    keys = [jax.random.key(i) for i in range(12)]
    for k in keys[:3]:  # cold, then remembered: positional and keyword calls
        f(model, x, k, (k, k))
        f(model, x, key=k, pair=(k, k))
    flattens = request.getfixturevalue("count_flattens")
    outs = [f(model, x, k, (k, k)) for k in keys[3:]]
    outs += [f(model, x, key=k, pair=(k, k)) for k in keys[3:]]
    assert flattens["n"] == 0
    for k, out in zip(keys[3:] * 2, outs):
        expected = model(x) + jax.random.normal(k, (3,)) + jax.random.uniform(k, (3,))
        assert jnp.allclose(out, expected)
    assert f.cache_info().traces == 2  # positional and keyword structures


def test_a_module_holding_a_key_and_a_step_returning_keys_flatten_nothing(request):
    @bw.filter_jit
    def step(model, key):
        key, sub = jax.random.split(key)
        model = bw.tree_at(lambda m: m.key, model, sub)
        return model, key, model(jnp.ones(3))

    model, key = _model(), jax.random.key(5)
    for _ in range(3):
        model, key, _ = step(model, key)
    flattens = request.getfixturevalue("count_flattens")
    seen = set()
    for _ in range(5):
        model, key, out = step(model, key)
        seen.add(float(out[0]))
    assert flattens["n"] == 0
    assert len(seen) == 5  # a fresh key every step
    assert step.cache_info().traces == 1


def test_a_raw_key_and_a_typed_key_are_different_programs():
    @bw.filter_jit
    def f(key):
        return jax.random.uniform(key, (2,))

    typed, raw = jax.random.key(3), jax.random.PRNGKey(3)
    for _ in range(3):
        assert (f(typed) == jax.random.uniform(typed, (2,))).all()
        assert (f(raw) == jax.random.uniform(raw, (2,))).all()
    assert f.cache_info().traces == 2
