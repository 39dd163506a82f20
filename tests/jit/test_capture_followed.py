"""Captured values read through helpers and methods (`_jit/_capture/`): each case
gives the eager result. Arrays read by the functions a compiled function reaches
are inputs; what methods read is part of the cache key (a retrace per change)."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

Y = jnp.zeros((4, 1))
X = jnp.ones((4, 2))


class Affine(bw.Module):
    w: jax.Array

    def __call__(self, v):
        return v @ self.w + Y.sum()


class Helpers:
    @staticmethod
    def shift(v):
        return v + Y.sum()


class Linear(bw.Module):
    w: jax.Array

    def __call__(self, v):
        return v @ self.w


def _model():
    return Affine(jnp.ones((2, 1)))


def _plain_model():
    return Linear(jnp.ones((2, 1)))


def _shifted(v):
    return v + Y.sum()


HELPERS = {"shift": _shifted}


@pytest.fixture(autouse=True)
def _restore():
    yield
    globals().update(Y=jnp.zeros((4, 1)))


def _rebind(value):
    globals()["Y"] = jnp.full((4, 1), value)


def _loss_body(m, x):
    return jnp.mean((jax.vmap(m)(x) - Y) ** 2)


def _step_a(m, x):
    return _LOSS_A(m, x)[0]


def _step_b(m, x):
    return _LOSS_B(m, x)[0]


def _step_c(m, x):
    return _LOSS_C(m, x)[0]


_LOSS_A = bw.filter_value_and_grad(_loss_body)
_LOSS_B = lambda m, x: (_loss_body(m, x), None)  # noqa: E731
_LOSS_C = lambda m, x: (bw.filter_grad(_loss_body)(m, x).w.sum(), None)  # noqa: E731
_CASES = {"value_and_grad": (_step_a, _LOSS_A), "plain": (_step_b, _LOSS_B)}
_CASES["grad_inline"] = (_step_c, _LOSS_C)


@pytest.mark.parametrize("case", list(_CASES))
def test_helper_wrapped_in_a_transform_sees_the_rebound_global(case):
    fun, loss = _CASES[case]
    step = bw.filter_jit(fun)
    step.clear_cache()
    m = _plain_model()
    for value in (0.0, 10.0, -3.0):
        _rebind(value)
        np.testing.assert_allclose(step(m, X), loss(m, X)[0], rtol=1e-5)


def test_filter_grad_and_filter_vmap_wrapped_helpers_by_name():
    globals()["_GRAD"] = bw.filter_grad(_loss_body)
    globals()["_VM"] = bw.filter_vmap(lambda v: v + Y.sum())
    globals()["_JVM"] = jax.vmap(lambda v: v * Y.sum())
    step = bw.filter_jit(lambda m, x: (_GRAD(m, x).w, _VM(x), _JVM(x)))  # noqa: F821
    m = _plain_model()
    for value in (0.0, 2.0):
        _rebind(value)
        out = step(m, X)
        eager = (_GRAD(m, X).w, _VM(X), _JVM(X))  # noqa: F821
        for a, b in zip(out, eager):
            np.testing.assert_allclose(a, b, rtol=1e-5)


def _scaled_sum(v, scale=1.0):
    return jnp.sum(v * Y.sum() * scale)


_LIBRARY: dict = {"functools": functools}  # another module's globals
exec(
    "def decorated(f):\n"
    "    @functools.wraps(f)\n"
    "    def call(*args):\n"
    "        return f(*args) * 2\n"
    "    return call\n",
    _LIBRARY,
)


class _Scaled(bw.Module):
    w: jax.Array

    def loss(self, v):
        return jnp.sum(v * self.w * Y.sum())


_TRANSFORMS = {
    "grad": jax.grad,
    "vmap": jax.vmap,
    "value_and_grad": jax.value_and_grad,
    "vmap_axis_1": functools.partial(jax.vmap, in_axes=1),
    # deeper: JAX's grad keeps `f` four closures down, and these add to that
    "grad_of_partial": lambda f: jax.grad(functools.partial(f, scale=2.0)),
    "vmap_of_grad": lambda f: jax.vmap(jax.grad(f)),
    "grad_of_vmap": lambda f: jax.grad(lambda v: jnp.sum(jax.vmap(f)(v))),
    "grad_of_method": lambda f: jax.grad(_Scaled(jnp.full((4, 2), 3.0)).loss),
}


# (one line wraps a new transform for each case: the warning about wrapping in a loop)
@pytest.mark.filterwarnings("ignore::boxwood.PerformanceWarning")
@pytest.mark.parametrize("transform", list(_TRANSFORMS))
def test_a_transform_of_a_function_given_directly_sees_the_rebound_global(transform):
    # `filter_jit(jax.grad(f))`: JAX's wrapper holds `f`; what `f` reads is watched
    transform = _TRANSFORMS[transform]
    step = bw.filter_jit(transform(_scaled_sum))
    for value in (1.0, 10.0, -3.0):
        _rebind(value)
        expected = transform(_scaled_sum)(X)
        for a, b in zip(jax.tree.leaves(step(X)), jax.tree.leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-5)
    assert step.cache_info().traces == 1  # `Y`, an array, is an input


def test_a_library_decorator_of_a_function_given_directly_sees_the_rebound_global():
    # a decorator from another module's globals (`functools.wraps`: `__wrapped__`)
    wrapped = _LIBRARY["decorated"](_scaled_sum)
    step = bw.filter_jit(wrapped)
    for value in (1.0, 4.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), wrapped(X), rtol=1e-6)
    assert step.__name__ == "_scaled_sum"


def test_helper_defined_after_wrapping():
    step = bw.filter_jit(lambda x: _LATER(x))  # noqa: F821

    def later(x):
        return x + Y.sum()

    globals()["_LATER"] = later
    for value in (1.0, 5.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), later(X))
    assert step.cache_info().traces == 1  # the new global is an input: no retrace
    hits = step.cache_info().hits
    for _ in range(3):
        step(X)
    assert step.cache_info().hits == hits + 3


def test_helper_redefined_after_the_first_call():
    globals()["_LATER2"] = lambda x: x * 2.0
    step = bw.filter_jit(lambda x: _LATER2(x))  # noqa: F821
    np.testing.assert_allclose(step(X), X * 2.0)
    # the new helper reads a global array: scanned again, traced again
    globals()["_LATER2"] = lambda x: x + Y.sum()
    _rebind(3.0)
    np.testing.assert_allclose(step(X), X + 12.0)
    _rebind(4.0)
    np.testing.assert_allclose(step(X), X + 16.0)
    traces = step.cache_info().traces
    # redefined again, reading the same names: the new helper is traced once
    globals()["_LATER2"] = lambda x: x - Y.sum()
    np.testing.assert_allclose(step(X), X - 16.0)
    assert step.cache_info().traces == traces + 1


def test_helper_in_a_dict():
    step = bw.filter_jit(lambda v: HELPERS["shift"](v))
    for value in (0.0, 1.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X))


def _shift_by(v, helper=_shifted):
    return helper(v)


def _shift_by_keyword(v, *, helpers=HELPERS):
    return helpers["shift"](v)


@pytest.mark.parametrize(
    "fun",
    [_shift_by, _shift_by_keyword, lambda v: _shift_by(v)],
    ids=["positional", "keyword_only_dict", "called_by_the_function"],
)
def test_a_helper_held_as_a_default_value_sees_the_rebound_global(fun):
    """A helper held as a parameter's default value (`def f(v, helper=helper)`)
    is followed like one read by name: the array it reads is an input (one
    trace), and rebinding it gives the new result (the old one before)."""
    step = bw.filter_jit(fun)
    for value in (0.0, 1.0, 2.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X))
    assert step.cache_info().traces == 1


def test_partial_of_a_helper_read_from_a_global():
    globals()["_PART"] = functools.partial(_shifted)
    step = bw.filter_jit(lambda v: _PART(v))  # noqa: F821
    for value in (0.0, 1.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X))


def _apply(v, helper, scale=1.0):
    return helper(v) * scale


def _apply_first(helper, v, scale=1.0):
    return helper(v) * scale


def test_a_helper_held_by_a_partials_arguments_sees_the_rebound_global():
    """A partial read from a global holding a helper among its arguments
    (`partial(apply, helper=shifted)`): the helper is followed like the
    partial's function, so the array it reads is an input (one trace)."""
    globals()["_PART_ARGS"] = functools.partial(_apply, helper=_shifted)
    globals()["_PART_POS"] = functools.partial(_apply_first, _shifted, scale=2.0)
    step = bw.filter_jit(lambda v: _PART_ARGS(v) + _PART_POS(v))  # noqa: F821
    for value in (0.0, 1.0, 2.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X) * 3.0)
    assert step.cache_info().traces == 1


def test_a_partial_given_directly_sees_what_its_arguments_helper_reads():
    """`filter_jit(partial(apply, helper=shifted))`: the helper among the
    partial's arguments is looked into as the partial's function is, so
    rebinding what it reads gives the new result."""
    step = bw.filter_jit(functools.partial(_apply, helper=_shifted))
    for value in (0.0, 1.0, 2.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X))


class _Settings:
    """A plain object (not a module) of this file holding a helper."""

    def __init__(self, loss_fn):
        self.loss_fn = loss_fn


_SETTINGS = _Settings(_shifted)


def test_a_helper_held_by_an_objects_attribute_sees_the_rebound_global():
    """`settings.loss_fn(v)`, where `settings` is a plain object of the user's
    own class: the helper its attribute holds is looked into like a method, so
    what it reads is part of the cache key and rebinding it gives the new
    result (the first trace's before)."""
    step = bw.filter_jit(lambda v: _SETTINGS.loss_fn(v))
    for value in (0.0, 1.0, 2.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X))


class _Holder:
    shift = staticmethod(_shifted)


@pytest.mark.parametrize(
    "fun",
    [
        lambda v: _shifted(v) + _Holder.shift(v),
        lambda v: _PART_ARGS(v) + _SETTINGS.loss_fn(v),  # noqa: F821
    ],
    ids=["by_name_and_static_method", "partial_and_attribute"],
)
def test_a_helper_reached_both_followed_and_as_a_method_sees_the_rebound_global(fun):
    """One helper reached two ways: followed (by name, or through a partial),
    where its copy reads the traced array, and as a static method or an
    object's attribute, where the original runs and reads the array at the
    trace. Both see the rebinding (the array is an input and keyed); the
    second way gave the first trace's value before."""
    globals()["_PART_ARGS"] = functools.partial(_apply, helper=_shifted)
    step = bw.filter_jit(fun)
    for value in (0.0, 1.0, 2.0):
        _rebind(value)
        np.testing.assert_allclose(step(X), _shifted(X) * 2.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda m: bw.filter_jit(m),
        lambda m: bw.filter_jit(m.__call__),
        lambda m: bw.filter_jit(lambda v: m(v)),
        lambda m: bw.filter_jit(lambda v: Helpers.shift(v)),
        lambda m: bw.filter_jit(functools.partial(lambda a, v: _shifted(v) * a, 1.0)),
    ],
    ids=["module", "bound_method", "lambda_calls_module", "staticmethod", "partial"],
)
def test_globals_read_inside_methods_are_keyed(make):
    step = make(_model())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: never stale
        first = step(X)
        np.testing.assert_allclose(step(X), first)
        traces = step.cache_info().traces
        _rebind(1.0)
        np.testing.assert_allclose(step(X), first + 4.0)  # traced with the new value
        np.testing.assert_allclose(step(X), first + 4.0)
        assert step.cache_info().traces == traces + 1
        _rebind(0.0)  # another array: a constant of the method, traced again
        np.testing.assert_allclose(step(X), first)
        assert step.cache_info().traces == traces + 2


def test_a_method_reading_only_numbers_says_nothing_at_the_first_call():
    class Scaled(bw.Module):
        w: jax.Array

        def __call__(self, v):
            return v @ self.w * _FACTOR  # a number: a trace-time constant, as in JAX

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bw.filter_jit(Scaled(jnp.ones((2, 1))))(X)


_FACTOR = 2.0


def test_a_watched_method_global_is_checked_on_every_call():
    step = bw.filter_jit(_model())
    step(X)
    hits = step.cache_info().hits
    for _ in range(3):
        step(X)
    assert step.cache_info().hits == hits + 3
    _rebind(2.0)
    np.testing.assert_allclose(step(X), X @ jnp.ones((2, 1)) + 8.0)


def test_wrappers_of_same_structured_modules_each_see_the_global():
    first = bw.filter_jit(_model())
    np.testing.assert_allclose(first(X), X @ jnp.ones((2, 1)))
    _rebind(1.0)
    second = bw.filter_jit(_model())
    np.testing.assert_allclose(second(X), X @ jnp.ones((2, 1)) + 4.0)
    np.testing.assert_allclose(first(X), X @ jnp.ones((2, 1)) + 4.0)


def test_unfollowed_reads_of_constants_cost_nothing():
    # a method reading no global array: the wrapper is the plain one (no layer)
    class Plain(bw.Module):
        w: jax.Array

        def __call__(self, v):
            return jnp.tanh(v @ self.w)

    m = Plain(jnp.ones((2, 1)))
    step = bw.filter_jit(m)
    assert step._boxwood_jit.call is step
