"""Methods of modules passed as arguments that read arrays from their globals, for
classes defined in another file than the compiled function (a package of the
user's; a class defined with the function's own globals is watched and keyed
instead: `test_capture_rows.py`): the value is fixed at the trace (a method runs
from its class), and boxwood says so at the first trace, naming the global, the
method and the function, once per method and global
(`boxwood/_jit/capture/arguments.py`)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

_Y = jnp.zeros(3)
_OFFSET = 2.0
_TABLE = jnp.arange(3.0)
_INNER = None  # set below: a module held by a global


class _Adds(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x + _Y


class _AddsNumber(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x + _OFFSET


class _Outer(bw.Module):
    inner: bw.Module

    def __call__(self, x):
        return self.inner(x)


class _InnerReadsTable(bw.Module):
    w: jax.Array

    def scaled(self, x):
        return self.w * x * _TABLE

    def __call__(self, x):
        return self.scaled(x)


class _AddsForConstants(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x + _TABLE_FOR_CONSTANTS


_TABLE_FOR_CONSTANTS = jnp.ones(3)


class _UsesGlobalModule(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return _INNER(x) + self.w


# the compiled function lives in another file than the classes (its own globals)
_ELSEWHERE: dict = {}
exec(compile("def _call(m, x):\n    return m(x)\n", "<elsewhere>", "exec"), _ELSEWHERE)
_call = _ELSEWHERE["_call"]


def test_the_first_trace_warns_naming_the_global_method_and_function():
    step = bw.filter_jit(_call)
    m = _Adds(jnp.ones(3))
    with pytest.warns(
        bw.CapturedValueWarning,
        match=r"global '_Y' \(an array float32\[3\]\) is read inside `_Adds.__call__`, "
        r"a method of a module passed to _call: .*keeps the value it has at this "
        r"first trace; rebinding it later is not seen\. Store it in a field of the "
        r"module or pass it as an argument",
    ):
        out = step(m, 1.0)
    np.testing.assert_array_equal(out, [1.0, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(m, 1.0)  # once per method and global
        bw.filter_jit(lambda a, x: a(x))(m, 2.0)  # here: watched, not warned


def test_a_nested_module_and_a_method_reached_through_another_are_seen():
    step = bw.filter_jit(_call)
    with pytest.warns(
        bw.CapturedValueWarning, match=r"global '_TABLE'.*`_InnerReadsTable.scaled`"
    ):
        step(_Outer(_InnerReadsTable(jnp.ones(3))), 1.0)


def test_a_global_holding_a_module_warns():
    global _INNER
    _INNER = _Adds(jnp.ones(3))
    with pytest.warns(bw.CapturedValueWarning, match=r"global '_INNER' \(_Adds"):
        bw.filter_jit(_call)(_UsesGlobalModule(jnp.ones(3)), 1.0)


def test_numbers_constants_mode_and_library_layers_stay_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # a number is a trace-time constant, as in JAX (checked when it changes)
        bw.filter_jit(_call)(_AddsNumber(jnp.ones(3)), 1.0)
        # capture="constants": everything is fixed at the trace, by choice
        m = _AddsForConstants(jnp.ones(3))
        bw.filter_jit(_call, capture="constants")(m, 1.0)
        # boxwood's (and other installed libraries') classes are not looked at
        layer = bw.nn.Linear(3, 2, key=jax.random.key(0))
        bw.filter_jit(_call)(layer, jnp.ones(3))


def test_only_classes_of_the_users_code_are_looked_at():
    import equinox
    import optax

    from boxwood._jit.capture import arguments

    assert arguments._user_class(_Adds)  # a test file: the user's code
    for library_class in (bw.nn.Linear, equinox.nn.Linear, optax.ScaleByAdamState):
        assert not arguments._user_class(library_class)


def test_the_same_class_warns_in_capture_inputs_mode():
    # (the class of the test above: silent only because of capture="constants")
    with pytest.warns(bw.CapturedValueWarning, match="_TABLE_FOR_CONSTANTS"):
        bw.filter_jit(_call)(_AddsForConstants(jnp.ones(3)), 1.0)


class _AddsForBothModes(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x + _TABLE_FOR_BOTH


_TABLE_FOR_BOTH = jnp.ones(3)


def test_an_inputs_wrapper_warns_after_a_constants_wrapper_of_the_same_function():
    # the two modes never share compiled code, so the "inputs" wrapper traces
    # (and looks at the argument's methods) itself
    m = _AddsForBothModes(jnp.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bw.filter_jit(_call, capture="constants")(m, 1.0)
    with pytest.warns(bw.CapturedValueWarning, match="_TABLE_FOR_BOTH"):
        bw.filter_jit(_call)(m, 1.0)
