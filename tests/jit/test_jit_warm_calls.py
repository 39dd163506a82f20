"""`filter_jit`'s warm calls: reference counts, objects kept alive, the wrapper's
identity as a function, and arguments that take the fast path."""

import gc
import inspect
import sys
import weakref

import jax
import jax.numpy as jnp
import optax
import pytest

import boxwood as bw


class Lin(bw.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float = bw.field(static=True, default=1.0)

    def __call__(self, x):
        return self.scale * (self.weight @ x + self.bias)


def _lin(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return Lin(jax.random.normal(k1, (3, 3)), jax.random.normal(k2, (3,)))


def test_warm_calls_keep_reference_counts_of_arguments_and_outputs():
    model, x = _lin(), jnp.ones(3)
    step = bw.filter_jit(lambda m, x: (m, m(x)))
    model, _ = step(model, x)  # returned: carries its flat form
    model, _ = step(model, x)
    leaves = jax.tree_util.tree_leaves(model)
    before = [sys.getrefcount(a) for a in (model, x, *leaves)]
    for _ in range(200):
        out = step(model, x)
    del out
    gc.collect()
    after = [sys.getrefcount(a) for a in (model, x, *leaves)]
    assert after == before
    assert step.cache_info().hits >= 200


_WATCHED = jnp.ones(3)


def test_warm_calls_that_check_watched_names_keep_reference_counts():
    def many(*xs):
        return sum(xs) * _WATCHED

    step = bw.filter_jit(many)
    x = jnp.ones(3)
    few, lots = (x, x), (x,) * 20
    for args in (few, lots, few, lots):
        step(*args)
    gc.collect()  # wrappers of earlier tests that still hold `_WATCHED`
    before = [sys.getrefcount(a) for a in (x, _WATCHED)]
    for _ in range(100):
        step(*few)
        step(*lots)
    gc.collect()
    assert [sys.getrefcount(a) for a in (x, _WATCHED)] == before
    assert step.cache_info().hits >= 200


@jax.numpy_dtype_promotion("standard")  # optax's Adam mixes int32 counts and floats
def test_training_step_does_not_accumulate_objects():
    tx = optax.adam(1e-2)
    model, x = _lin(), jnp.ones(3)
    opt_state = tx.init(bw.filter(model, bw.is_inexact_array))

    @bw.filter_jit
    def step(model, opt_state, x):
        loss, grads = bw.filter_value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return bw.apply_updates(model, updates), opt_state, loss

    for _ in range(20):
        model, opt_state, loss = step(model, opt_state, x)
    gc.collect()
    arrays_before = len(jax.live_arrays())  # other tests in this process hold some
    counts = {}
    for _ in range(3):
        for _ in range(100):
            model, opt_state, loss = step(model, opt_state, x)
        gc.collect()
        counts[len(counts)] = len(gc.get_objects())
    assert counts[2] - counts[0] < 50, counts  # nothing grows with the step count
    assert len(jax.live_arrays()) - arrays_before < 10


def test_wrapper_dies_with_its_last_reference():
    def fun(x):
        return x + 1

    jitted = bw.filter_jit(fun)
    jitted(jnp.ones(2))
    jitted(jnp.ones(2))
    ref = weakref.ref(jitted)
    del jitted
    gc.collect()
    assert ref() is None


def test_wrapper_looks_like_the_function_and_binds_as_a_method():
    def scale(self, x, factor=2.0):
        """Scale x."""
        return x * factor

    jitted = bw.filter_jit(scale)
    assert jitted.__name__ == "scale" and jitted.__doc__ == "Scale x."
    assert jitted.__wrapped__ is scale
    assert inspect.signature(jitted) == inspect.signature(scale)
    assert "scale" in repr(jitted)

    class Holder:
        method = jitted

    out = Holder().method(jnp.ones(2))
    assert jnp.allclose(out, 2.0)
    assert Holder.method is jitted


def test_errors_in_the_function_propagate_from_a_warm_wrapper():
    def fun(x):
        if x.shape[0] == 3:
            raise ValueError("three is not allowed")
        return x * 2

    jitted = bw.filter_jit(fun)
    jitted(jnp.ones(2))
    jitted(jnp.ones(2))
    with pytest.raises(ValueError, match="three is not allowed"):
        jitted(jnp.ones(3))
    assert jnp.allclose(jitted(jnp.ones(2)), 2.0)  # still works afterwards


def test_deeply_nested_arguments_take_the_fast_path():
    nested = jnp.ones(2)
    for _ in range(100):
        nested = (nested,)
    traces = []

    @bw.filter_jit
    def fun(t):
        traces.append(1)
        for _ in range(100):
            (t,) = t
        return t + 1

    for _ in range(4):
        out = fun(nested)
    assert jnp.allclose(out, 2.0)
    assert len(traces) == 1
    assert fun.cache_info().hits == 3


def test_rebuilt_modules_have_the_fields_and_keep_user_construction():
    class Checked(bw.Module):
        w: jax.Array
        n: int = bw.field(static=True, default=2)

        def __check_init__(self):
            if self.w.ndim != 1:
                raise ValueError("`w` must be 1-D")

    m = Checked(jnp.arange(3.0))
    m2 = jax.tree_util.tree_map(lambda a: a * 2, m)
    assert (
        type(m2) is Checked
        and m2.n == 2
        and jnp.allclose(m2.w, jnp.array([0.0, 2.0, 4.0]))
    )
    assert set(vars(m2)) == set(vars(m))
    with pytest.raises(ValueError, match="`w` must be 1-D"):
        Checked(jnp.ones((2, 2)))  # user construction still runs the checks
    leaves, treedef = jax.tree_util.tree_flatten(m)
    before = [sys.getrefcount(a) for a in leaves]
    for _ in range(100):
        treedef.unflatten(leaves)
    gc.collect()
    assert [sys.getrefcount(a) for a in leaves] == before


def test_lists_and_dicts_inside_arguments_take_the_fast_path(monkeypatch):
    from boxwood._jit import _dispatch as _jit

    flattens = []
    real = _jit._flatten
    monkeypatch.setattr(_jit, "_flatten", lambda t: flattens.append(1) or real(t))
    traces = []

    @bw.filter_jit
    def fun(items, scale):
        traces.append(1)
        return items[0] * scale + items[1]["b"] * items[2]

    args = ([jnp.ones(2), {"b": jnp.full(2, 3.0)}, 2.0], 4.0)
    for i in range(5):
        if i == 2:
            before = len(flattens)
        out = fun(*args)
    assert jnp.allclose(out, 10.0)
    assert len(traces) == 1 and fun.cache_info().hits == 4
    assert len(flattens) == before  # no flatten once the key is known
    assert jnp.allclose(fun([jnp.ones(2), {"b": jnp.ones(2)}, 1.0], 1.0), 2.0)
    assert len(traces) == 2  # a new static value (2.0 -> 1.0) traces again


def test_tree_pformat_prints_a_jitted_function_like_a_function():
    def h(x):
        return x

    class Holds(bw.Module):
        fn: object = bw.field(static=True)

    text = bw.tree_pformat(Holds(bw.filter_jit(h)), width=1000)
    assert text == f"Holds(fn=<function {h.__qualname__}>)"
