"""Methods of modules passed as arguments that read their globals, for classes
defined in another file than the compiled function (a `layers.py` of the user's
next to the notebook; a class defined with the function's own globals:
`test_capture_rows.py`): what they read is watched in that file's globals and
keyed, so rebinding it traces once more with the new value, and an explanation
names it with its file (`global 'layers.SCALE'`). Classes of installed libraries
are not looked at (`boxwood/_jit/_capture/_arguments.py`)."""

import functools
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
exec(
    compile(
        "class Caller:\n    def __call__(self, m, x):\n        return m(x)\n",
        "<elsewhere>",
        "exec",
    ),
    _ELSEWHERE,
)
# What `filter_jit` is given: a function, or a callable that is not one
_CALLABLES = {
    "function": lambda: _call,
    "partial": lambda: functools.partial(_call),
    "object": lambda: _ELSEWHERE["Caller"](),
}


@pytest.fixture
def rebind():
    """`rebind(name, value)` for this file's globals, put back after the test."""
    saved = {}

    def set_(name, value):
        saved.setdefault(name, globals()[name])
        globals()[name] = value

    yield set_
    globals().update(saved)


def _traces(f) -> int:
    return f.cache_info().traces


@pytest.mark.parametrize("given", list(_CALLABLES))
@pytest.mark.parametrize("name, value", [("_OFFSET", 5.0), ("_Y", jnp.ones(3))])
def test_rebinding_a_global_read_in_another_files_method_is_seen(
    rebind, name, value, given
):
    cls = _AddsNumber if name == "_OFFSET" else _Adds
    step = bw.filter_jit(_CALLABLES[given]())
    m = cls(jnp.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = step(m, 1.0)
        rebind(name, value)
        after = step(m, 1.0)
        np.testing.assert_array_equal(after, m(1.0))  # as the eager call gives
        assert not np.array_equal(before, after)
        step(m, 1.0)
    assert _traces(step) == 2  # one trace per change, then warm


def test_the_explanation_names_the_global_with_its_file(rebind):
    step = bw.filter_jit(_call, explain=True)
    m = _AddsNumber(jnp.ones(3))
    step(m, 1.0)
    rebind("_OFFSET", 7.0)
    with pytest.warns(
        bw.RecompileWarning,
        match=r"global '[\w.]*test_capture_arguments\._OFFSET': 2\.0 -> 7\.0",
    ):
        step(m, 1.0)
    rebind("_OFFSET", 2.0)  # back: the first trace's code, no new trace
    step(m, 1.0)
    assert _traces(step) == 2


def test_a_nested_module_and_a_method_reached_through_another_are_seen(rebind):
    step = bw.filter_jit(_call)
    m = _Outer(_InnerReadsTable(jnp.ones(3)))
    np.testing.assert_array_equal(step(m, 1.0), [0.0, 1.0, 2.0])
    rebind("_TABLE", jnp.full(3, 2.0))
    np.testing.assert_array_equal(step(m, 1.0), [2.0, 2.0, 2.0])


def test_a_global_holding_a_module_is_seen(rebind):
    rebind("_INNER", _Adds(jnp.ones(3)))
    step = bw.filter_jit(_call)
    m = _UsesGlobalModule(jnp.ones(3))
    np.testing.assert_array_equal(step(m, 1.0), [2.0, 2.0, 2.0])
    rebind("_INNER", _Adds(jnp.full(3, 3.0)))
    np.testing.assert_array_equal(step(m, 1.0), [4.0, 4.0, 4.0])


def test_constants_mode_keeps_the_first_value_by_choice(rebind):
    step = bw.filter_jit(_call, capture="constants")
    m = _AddsForConstants(jnp.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(m, 1.0)
        rebind("_TABLE_FOR_CONSTANTS", jnp.zeros(3))
        np.testing.assert_array_equal(step(m, 1.0), [2.0, 2.0, 2.0])


def test_only_classes_of_the_users_code_are_looked_at():
    import equinox
    import optax

    from boxwood._jit._capture import _arguments

    assert _arguments._user_class(_Adds)  # a test file: the user's code
    for library_class in (bw.nn.Linear, equinox.nn.Linear, optax.ScaleByAdamState):
        assert not _arguments._user_class(library_class)
    layer = bw.nn.Linear(3, 2, key=jax.random.key(0))
    assert _arguments.argument_reads((layer,), {}) == {}


def test_a_callable_that_takes_no_per_call_check_warns_once():
    """A callable that reaches no Python function (here a `jax.jit` function
    under a `functools.partial`: no globals to watch names in) is compiled as
    it is: an array read by a method of its module argument is fixed at the
    trace, and says so."""
    step = bw.filter_jit(functools.partial(jax.jit(_call)))
    m = _Adds(jnp.ones(3))
    with pytest.warns(
        bw.CapturedValueWarning,
        match=r"global '_Y' \(an array float32\[3\]\) is read inside `_Adds.__call__`, "
        r"a method of a module passed to .*keeps the value it has at this first "
        r"trace; rebinding it later is not seen\. Store it in a field of the module "
        r"or pass it as an argument",
    ):
        step(m, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(m, 2.0)  # once per method and global


def test_a_package_installed_into_a_folder_of_its_own_is_a_library(tmp_path):
    """`pip install --target DIR` (a folder on `PYTHONPATH`, not site-packages):
    the folder holds the packages' `*.dist-info`, so their classes are a
    library's; the same package without it is the user's."""
    import importlib
    import sys

    from boxwood._jit._capture import _arguments

    package = tmp_path / "site" / "somelib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import boxwood as bw\n\nclass Layer(bw.Module):\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        layer_class = importlib.import_module("somelib").Layer
        assert _arguments._user_class(layer_class)
        (tmp_path / "site" / "somelib-1.0.dist-info").mkdir()
        _arguments._holds_installed.cache_clear()
        assert not _arguments._user_class(layer_class)
    finally:
        sys.path.remove(str(tmp_path / "site"))
        sys.modules.pop("somelib", None)
        _arguments._holds_installed.cache_clear()
