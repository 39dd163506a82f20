"""Keyword calls of `filter_jit` wrappers take the warm-call path (C and Python)."""

import warnings

import jax
import jax.numpy as jnp

import boxwood as bw

# every test runs on the compiled and the Python warm-call path (conftest.py)


class Lin(bw.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(self.weight @ x + self.bias)


def test_keyword_calls_are_not_flattened_once_warm(count_flattens):
    traces = []

    @bw.filter_jit
    def f(model, x, *, scale=None):
        traces.append(1)
        return model(x) * scale

    model = Lin(jnp.eye(3), jnp.zeros(3))
    x = jnp.arange(3.0)
    for _ in range(2):  # the module gets its flat form on its second call
        f(model=model, x=x, scale=jnp.float32(2))
    before = count_flattens["n"]
    for _ in range(3):
        out = f(model=model, x=x, scale=jnp.float32(2))
        out = f(scale=jnp.float32(2), x=x, model=model)  # other keyword order
    assert jnp.allclose(out, jnp.tanh(x) * 2)
    assert count_flattens["n"] == before
    assert len(traces) == 1
    assert f.cache_info().hits == 7


def test_mixed_positional_and_keyword_calls_share_compiled_code():
    traces = []

    @bw.filter_jit
    def f(a, b, c=None):
        traces.append(1)
        return a + b * c

    a, b, c = jnp.ones(2), jnp.full(2, 2.0), jnp.full(2, 3.0)
    for _ in range(3):
        assert jnp.allclose(f(a, b, c=c), 7.0)
    for _ in range(3):
        assert jnp.allclose(f(a, c=c, b=b), 7.0)
    # `f(a, b, c=c)` and `f(a, c=c, b=b)` flatten differently: two signatures
    assert len(traces) == 2


def test_keyword_static_values_choose_the_compiled_code():
    traces = []

    @bw.filter_jit
    def f(x, *, power):
        traces.append(power)
        return x**power

    x = jnp.full(2, 2.0)
    for power in (2, 3, 2, 3, 2):
        assert jnp.allclose(f(x, power=power), 2.0**power)
    assert traces == [2, 3]


def test_keyword_call_that_retraces_on_the_warm_path_names_the_keyword():
    f = bw.filter_jit(lambda *, x: x.sum(), donate="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            f(x=jnp.ones(3))
    # same key (an array), new shape: the warm path calls, JAX retraces inside
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(x=jnp.ones(4))
    ours = [str(w.message) for w in caught if "could not be donated" in str(w.message)]
    assert len(ours) == 1 and "kwargs['x']" in ours[0]
    assert f.cache_info().traces == 2


def test_first_argument_by_keyword_is_kept_out_of_donation_when_warm():
    g = bw.filter_jit(lambda m, x: (m["w"] + 1, x * 2), donate="all-except-first")
    for _ in range(3):
        m = {"w": jnp.ones(2)}
        x = jnp.ones(2)
        g(m=m, x=x)
        assert not m["w"].is_deleted() and x.is_deleted()


def test_many_keyword_arguments_are_handed_to_the_python_path():
    names = [f"k{i:02d}" for i in range(40)]
    f = bw.filter_jit(lambda **kw: sum(kw.values()))
    kwargs = {n: jnp.ones(()) for n in reversed(names)}
    for _ in range(3):
        assert f(**kwargs) == 40.0
    assert f.cache_info().traces == 1 and f.cache_info().hits == 2
