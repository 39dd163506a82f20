"""The per-call check of the names a `filter_jit` function reads (`_jit/_capture/`):
with the C extension it runs inside `FastCall` (no Python frame between the caller
and the compiled call); without it, in `capture.Layer`'s generated function.
On both paths a warm call must see every rebinding: an array becomes the new input,
a changed trace-time constant is traced with once."""

import types
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

SCALE = 2.0  # a trace-time constant
W = jnp.ones(3)  # an input


def _times_scale():
    return lambda x: x * SCALE  # a new function (and store) for every test


def _times_w():
    return lambda x: x * W


@pytest.fixture(autouse=True)
def _restore_globals():
    yield
    globals().update(SCALE=2.0, W=jnp.ones(3))


def test_the_check_is_a_generated_function_in_front_of_the_wrapper():
    f = bw.filter_jit(_times_scale())
    assert f._boxwood_jit.call is not f  # the names are watched
    assert type(f) is types.FunctionType
    f(jnp.ones(3))
    for _ in range(5):
        f(jnp.ones(3))
    assert f.cache_info().hits == 5 and f.cache_info().traces == 1


def test_a_rebound_constant_retraces_once_after_warm_calls():
    global SCALE
    f = bw.filter_jit(_times_scale())
    for _ in range(3):
        np.testing.assert_allclose(f(jnp.ones(3)), 2.0)
    SCALE = 5.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", bw.CapturedValueWarning)
        for _ in range(3):  # traced once for the new value, then warm again
            np.testing.assert_allclose(f(jnp.ones(3)), 5.0)
    assert f.cache_info() == (4, 2, 2, 2)
    SCALE = 2.0  # back: the code traced for 2.0 is found
    np.testing.assert_allclose(f(jnp.ones(3)), 2.0)
    assert f.cache_info().traces == 2


def test_a_rebound_array_global_is_the_new_input_without_a_retrace():
    global W
    f = bw.filter_jit(_times_w())
    np.testing.assert_allclose(f(jnp.ones(3)), 1.0)
    np.testing.assert_allclose(f(jnp.ones(3)), 1.0)
    W = 4.0 * jnp.ones(3)
    np.testing.assert_allclose(f(jnp.ones(3)), 4.0)
    np.testing.assert_allclose(f(jnp.ones(3)), 4.0)
    assert f.cache_info().traces == 1
    W = jnp.ones(4)  # a new shape: traced again, not a stale constant
    np.testing.assert_allclose(f(jnp.ones(4)), 1.0)
    assert f.cache_info().traces == 2


def test_closure_cells_are_checked_too():
    w = jnp.ones(2)
    k = 3

    def f(x):
        return x * w * k

    g = bw.filter_jit(f)
    np.testing.assert_allclose(g(jnp.ones(2)), 3.0)
    np.testing.assert_allclose(g(jnp.ones(2)), 3.0)
    w = 2.0 * jnp.ones(2)
    np.testing.assert_allclose(g(jnp.ones(2)), 6.0)
    assert g.cache_info().traces == 1
    k = 4
    np.testing.assert_allclose(g(jnp.ones(2)), 8.0)
    assert g.cache_info().traces == 2


def test_a_deleted_global_is_seen():
    f = bw.filter_jit(lambda x: x * GONE)  # noqa: F821
    globals()["GONE"] = jnp.asarray(2.0)
    try:
        assert f(jnp.ones(())) == 2.0
        assert f(jnp.ones(())) == 2.0
    finally:
        del globals()["GONE"]
    with pytest.raises(NameError, match="GONE"):
        f(jnp.ones(()))


def test_keywords_and_many_arguments_pass_through_with_the_hidden_values():
    def many(*xs, scale_by=1.0):
        return sum(xs) * W * scale_by

    f = bw.filter_jit(many)
    xs = [jnp.ones(3)] * 20  # more than the C path's stack buffer
    for _ in range(3):
        np.testing.assert_allclose(f(*xs, scale_by=jnp.asarray(0.5)), 10.0)
        np.testing.assert_allclose(f(jnp.ones(3)), 1.0)
    assert f.cache_info().traces == 2 and f.cache_info().hits == 4


def test_clear_cache_resets_the_hits_of_every_path():
    f = bw.filter_jit(_times_w())
    f(jnp.ones(3))
    f(jnp.ones(3))
    f.clear_cache()
    assert f.cache_info() == (0, 0, 0, 0)
    f(jnp.ones(3))
    f(jnp.ones(3))
    assert f.cache_info().hits == 1 and f.cache_info().misses == 1
