"""Static values that compare equal (`1 == 1.0 == True`, `0.0 == -0.0`) but give
different programs never share compiled code; neither do module classes whose
treedefs JAX would compare equal."""

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw
import boxwood.nn as nn
from boxwood._module._flat_key import token_for

# every test runs on the compiled and the Python warm-call path (conftest.py)

EQUAL_VALUES = [(1, 1.0), (1, True), (1.0, True), (0.0, -0.0), (-0.0, 0.0)]


def _apply(x, s):
    # the dtype follows the static value's type; 1/(x + s) its sign (x: 0.0)
    return jnp.asarray(s), 1.0 / (x + jnp.asarray(s, jnp.float32))


def _same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert jnp.array_equal(g, w)


@pytest.mark.parametrize("a, b", EQUAL_VALUES)
def test_static_arguments(a, b):
    f = bw.filter_jit(_apply)
    f.clear_cache()  # the compiled code of `_apply` is shared between wrappers
    x = jnp.zeros(())
    for value in (a, a, a, b, b, a, b):  # warm (fast path) and cold calls
        _same(f(x, value), _apply(x, value))
    assert f.cache_info().traces == 2


@pytest.mark.parametrize("a, b", EQUAL_VALUES)
def test_static_keyword_arguments(a, b):
    f = bw.filter_jit(_apply)
    f.clear_cache()  # the compiled code of `_apply` is shared between wrappers
    x = jnp.zeros(())
    for value in (a, a, a, b, b, a):
        _same(f(x, s=value), _apply(x, value))
    assert f.cache_info().traces == 2


def _from_tuple(x, t):
    return _apply(x, t[1])


def _call(m, x):
    return m(x)


def _call_only(m, x):  # called with modules whose methods read no global
    return m(x)


@pytest.mark.parametrize("a, b", EQUAL_VALUES)
def test_static_values_inside_tuples(a, b):
    f = bw.filter_jit(_from_tuple)
    f.clear_cache()
    x = jnp.zeros(())
    for value in (a, a, a, b, b, a):
        _same(f(x, ("k", value)), _apply(x, value))
    assert f.cache_info().traces == 2


class Scaled(bw.Module):
    w: jax.Array
    s: float = bw.field(static=True)

    def __call__(self, x):
        return _apply(x + self.w, self.s)


@pytest.mark.parametrize("a, b", EQUAL_VALUES)
def test_static_module_fields(a, b):
    f = bw.filter_jit(_call)
    f.clear_cache()
    x = jnp.zeros(())
    w = jnp.zeros(())
    for value in (a, a, a, b, b, a):
        m = Scaled(w, value)
        _same(f(m, x), m(x))
        _same(f(m, x), m(x))  # the same module again: its flat form is used
    assert f.cache_info().traces == 2
    # bound methods: the function's own static fields
    x = jnp.zeros(())
    for value in (a, b, a):
        m = Scaled(w, value)
        _same(bw.filter_jit(m.__call__)(x), m(x))
    # the modules' flat-form tokens differ
    ta = jax.tree_util.tree_structure(Scaled(w, a))
    tb = jax.tree_util.tree_structure(Scaled(w, b))
    assert ta != tb and token_for(ta) is not token_for(tb)


def test_module_treedefs_compare_equal_only_for_equal_values():
    w = jnp.zeros(())
    ta = jax.tree_util.tree_structure(Scaled(w, 2.0))
    assert ta == jax.tree_util.tree_structure(Scaled(w, 2.0))
    assert hash(ta) == hash(jax.tree_util.tree_structure(Scaled(w, 2.0)))
    assert ta == jax.tree_util.tree_structure(
        jax.tree_util.tree_map(lambda a: a, Scaled(w, 2.0))
    )


class First(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return x + self.w


class Second(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return x - self.w


@pytest.mark.parametrize(
    "make_a, make_b",
    [
        (lambda: nn.LayerNorm(4), lambda: nn.RMSNorm(4)),
        (lambda: First(jnp.ones(4)), lambda: Second(jnp.ones(4))),
    ],
)
def test_module_classes_with_the_same_fields_never_share(make_a, make_b):
    a, b = make_a(), make_b()
    ta = jax.tree_util.tree_structure(a)
    tb = jax.tree_util.tree_structure(b)
    assert ta != tb  # JAX 0.10.2 compares their treedefs equal on its own
    assert token_for(ta) is not token_for(tb)
    f = bw.filter_jit(_call_only)
    f.clear_cache()
    x = jnp.arange(4.0)
    for m in (a, a, a, b, b, b, a, b):
        assert jnp.allclose(f(m, x), m(x))
    assert f.cache_info().traces == 2
    wrapper = f._boxwood_jit
    store = wrapper._store
    plans = list(store.plan_variants.values())
    assert len(plans) == 2
    entries = {id(p.only) for p in plans}
    assert len(entries) == 2
    tokens = {key[0] for key in store.fast_plans}  # (token, ARRAY_TOKEN)
    assert len(tokens) == 2
