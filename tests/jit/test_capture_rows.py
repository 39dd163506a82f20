"""Editing and re-running notebook cells never leaves a stale compiled result: each
name a `filter_jit` function reads (directly, through the functions it calls, or
inside the methods of modules it reads or is given) is part of its cache key, so
rebinding it retraces once with the new value, and the recompile explanation
names the change (`_jit/_capture/`). Each test is one cell sequence, with the
values rebound as a re-run cell rebinds them (a module's globals)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import boxwood as bw
from boxwood._jit._capture import value_key

X = jnp.ones(())
LR = 0.1
SCALE = 2.0
optimizer = optax.sgd(0.1)


def helper(x):
    return x * 5.0


class Model(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x * SCALE


class Built(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w + x


@pytest.fixture(autouse=True)
def _restore():
    saved = dict(globals())
    yield
    globals().update(
        {k: saved[k] for k in ("LR", "SCALE", "optimizer", "helper", "Built")}
    )


def _exact(caught, pattern):
    import re

    texts = [str(w.message) for w in caught if w.category is bw.RecompileWarning]
    assert any(re.search(pattern, t, re.M) for t in texts), texts


def test_a_global_number_rebound_twice_retraces_each_time():
    global LR

    @bw.filter_jit(explain=True)
    def step(x):
        return x * LR

    assert step(X) == pytest.approx(0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LR = 0.0
        assert step(X) == 0.0
        LR = 1.0
        assert step(X) == 1.0
        assert step(X) == 1.0
    _exact(caught, r"^  global 'LR': 0\.1 -> 0\.0$")
    _exact(caught, r"^  global 'LR': 0\.0 -> 1\.0$")
    assert not [w for w in caught if w.category is bw.CapturedValueWarning]
    assert step.cache_info() == (1, 3, 3, 3)
    LR = 0.1  # an earlier value: its compiled code is found again
    assert step(X) == pytest.approx(0.1)
    assert step.cache_info().traces == 3


def test_a_recreated_optax_optimizer_is_used():
    global optimizer

    @bw.filter_jit
    def update(grads, state):
        updates, _ = optimizer.update(grads, state)
        return updates

    grads = {"w": jnp.ones(2)}
    state = optimizer.init(grads)
    np.testing.assert_allclose(update(grads, state)["w"], [-0.1, -0.1])
    optimizer = optax.sgd(0.0)  # the cell re-run with another learning rate
    np.testing.assert_allclose(update(grads, state)["w"], [0.0, 0.0])
    assert update.cache_info().traces == 2


def test_an_edited_helper_function_is_called():
    global helper

    @bw.filter_jit(explain=True)
    def step(x):
        return helper(x)

    assert step(X) == 5.0

    def helper(x):  # the helper's cell, edited and re-run
        return x * 3.0

    with pytest.warns(
        bw.RecompileWarning,
        match=r"global 'helper': function helper -> function helper \(definition 2\)",
    ):
        assert step(X) == 3.0
    assert step(X) == 3.0
    assert step.cache_info().traces == 2


def test_functions_are_keyed_by_identity_and_code():
    def f(x):
        return x

    def g(x):
        return x + 1

    assert value_key(f) == value_key(f) and value_key(f) != value_key(g)
    key = value_key(f)
    f.__code__ = g.__code__  # as `%autoreload` patches a function in place
    assert value_key(f) != key
    assert value_key((1, 2.0)) == value_key((1, 2.0)) != value_key((1.0, 2.0))
    assert value_key(-0.0) != value_key(0.0)
    assert value_key(float("nan")) == value_key(float("nan"))


@pytest.mark.parametrize(
    "make",
    [
        lambda m: bw.filter_jit(m),
        lambda m: bw.filter_jit(m.__call__),
        lambda m: bw.filter_jit(lambda x: m(x)),
        lambda m: (lambda f: lambda x: f(m, x))(bw.filter_jit(lambda mm, x: mm(x))),
        lambda m: (lambda f: lambda x: f(m, x))(
            bw.filter_jit(lambda mm, x: mm(x) + LR)
        ),
    ],
    ids=["module", "bound_method", "global_module", "argument", "argument_and_global"],
)
def test_a_global_read_inside_a_modules_method(make):
    global SCALE
    model = Model(jnp.asarray(1.0))
    call = make(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = call(X)
        assert first == pytest.approx(2.0 + 0.0 * LR, abs=0.2)
        SCALE = 3.0
        assert call(X) - first == pytest.approx(1.0)  # eager: model(X) is 3.0
        assert call(X) - first == pytest.approx(1.0)
        SCALE = 2.0
        assert call(X) == first


def test_an_argument_method_global_explained_and_counted():
    global SCALE
    step = bw.filter_jit(lambda m, x: m(x), explain=True)
    model = Model(jnp.asarray(1.0))
    assert step(model, X) == 2.0
    assert step(model, X) == 2.0  # its layer, from the first trace on
    SCALE = 5.0
    with pytest.warns(bw.RecompileWarning, match=r"global 'SCALE': 2\.0 -> 5\.0"):
        assert step(model, X) == 5.0
    assert step(model, X) == 5.0
    assert step.cache_info() == (2, 2, 2, 2)  # one trace per value: no more
    SCALE = 2.0  # back: the code of the first trace
    assert step(model, X) == 2.0
    assert step.cache_info().traces == 2


def test_a_redefined_module_class_built_by_name():
    global Built

    @bw.filter_jit
    def build_and_run(x):
        return Built(jnp.asarray(1.0))(x)

    assert build_and_run(X) == 2.0

    class Built(bw.Module):  # the class's cell, edited and re-run
        w: jax.Array

        def __call__(self, x):
            return self.w - x

    assert build_and_run(X) == 0.0
    assert build_and_run.cache_info().traces == 2


def test_a_list_in_a_static_field_warns_at_construction_naming_the_fix():
    class Config(bw.Module):
        sizes: list = bw.field(static=True)
        names: dict = bw.field(static=True)

    with pytest.warns(UserWarning) as record:
        Config([1, 2], {"a": 1})
    messages = sorted(str(w.message) for w in record)
    assert messages == [
        "`Config.names` is a static field holding a dict: static fields are part "
        "of the compiled code's cache key, and a dict can be changed in place "
        "after construction, where no cache can see it (a compiled call would "
        "keep using the old contents). Use a tuple of `(key, value)` pairs (or a "
        "module holding the values).",
        "`Config.sizes` is a static field holding a list: static fields are part "
        "of the compiled code's cache key, and a list can be changed in place "
        "after construction, where no cache can see it (a compiled call would "
        "keep using the old contents). Use a tuple.",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = Config([3], {})  # once per class and field; accepted all the same
        Config((1, 2), ())  # the fix
    assert config.sizes == [3]


def test_a_script_that_never_rebinds_stays_on_the_warm_path():
    step = bw.filter_jit(lambda x: helper(x) * LR)
    step(X)
    for _ in range(5):
        step(X)
    assert step.cache_info() == (5, 1, 1, 1)
    cells = dict(zip(step.__code__.co_freevars, step.__closure__))
    # the first constants need no static name: the hidden argument stays `None`,
    # as for a function whose constants were not keyed
    assert cells["_bw_state"].cell_contents.snap[-1] is None


def test_the_third_compile_prints_a_note_under_ipython(monkeypatch, capsys):
    global LR
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: object(), raising=False)

    @bw.filter_jit
    def step(x):
        return x * LR

    step(X)
    LR = 0.0
    step(X)
    assert capsys.readouterr().out == ""  # a second compile says nothing
    LR = 1.0
    step(X)
    assert capsys.readouterr().out == (
        "boxwood: filter_jit(test_the_third_compile_prints_a_note_under_ipython."
        "<locals>.step) compiled for the 3rd time: global 'LR': 0.0 -> 1.0 "
        "(`boxwood.config.recompile_notes = False` silences this)\n"
    )
    LR = 2.0
    step(X)
    assert capsys.readouterr().out == ""  # the third only
    monkeypatch.setattr(bw.config, "recompile_notes", False)
    again = bw.filter_jit(lambda x: x * LR)
    for value in (3.0, 4.0, 5.0):
        LR = value
        again(X)
    assert capsys.readouterr().out == ""


def test_no_note_outside_ipython(capsys):
    global LR
    step = bw.filter_jit(lambda x: x * LR)
    for value in (3.0, 4.0, 5.0):
        LR = value
        step(X)
    assert capsys.readouterr().out == ""


def test_no_note_for_boxwoods_own_functions(monkeypatch, capsys):
    """boxwood's own compiled functions (such as `generate`'s decoding loop)
    recompile for their callers' reasons: no note names them."""
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: object(), raising=False)

    def scaled(x, factor):
        return x * factor

    scaled.__module__ = "boxwood.models._example"
    loop = bw.filter_jit(scaled)
    for factor in (1.0, 2.0, 3.0):
        loop(X, factor)
    assert capsys.readouterr().out == ""

    def mine(x, factor):  # the same function, the user's: a note
        return x * factor

    user = bw.filter_jit(mine)
    for factor in (1.0, 2.0, 3.0):
        user(X, factor)
    assert "compiled for the 3rd time: args[1]" in capsys.readouterr().out
