"""Arrays and modules that a `filter_jit` function reads from its globals or its
closure are inputs: rebinding them is seen on the next call (`_jit/_capture/`)."""

import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood import nn
from boxwood._jit._capture import Reads, has_arrays

# every test runs on the compiled and the Python warm-call path (conftest.py)

# Globals the functions below read; tests rebind them with `global`.
W = jnp.ones(3)
MODEL = None
PARAMS = {"w": jnp.ones(2), "b": (jnp.zeros(()),)}
LR = 0.1
COUNT = 0


def _scaled(x):
    return W * x  # a helper: its globals are followed too


def _uses_helper(x):
    return _scaled(x) + 1


def _counts(x):
    global COUNT
    COUNT += 1
    return x * 2


# ------------------------------------------------------------------ the scan
def test_reads_finds_globals_cells_helpers_and_skips_state():
    y = jnp.ones(2)
    n = 0

    def f(x):
        nonlocal n
        n += 1

        def inner():
            return PARAMS["w"] + y

        return jnp.sin(_scaled(x)) + inner() + len(x) + LR

    reads = Reads(f)
    assert sorted(reads.globals) == ["LR", "PARAMS", "W", "_scaled"]  # no jnp, len
    assert [label for label, _ in reads.cells] == ["closure 'y'"]  # `n` is state
    assert reads.global_helpers == ["_scaled"]
    assert "COUNT" in Reads(_counts).stored and Reads(_counts).globals == []


def test_has_arrays():
    assert has_arrays(jnp.ones(2)) and has_arrays(np.ones(2))
    assert has_arrays({"a": [1, jnp.ones(1)]})
    assert not has_arrays(0.1) and not has_arrays((1, "a")) and not has_arrays(len)
    assert has_arrays(nn.Linear(2, 1, key=jax.random.key(0)))


# ------------------------------------------------------------------ behaviour
def test_global_array_rebound_is_seen_without_retrace():
    global W
    f = bw.filter_jit(lambda x: W @ x)
    x = jnp.ones(3)
    try:
        assert f(x) == 3.0
        W = W * 2
        assert f(x) == 6.0
        assert f.cache_info().traces == 1
    finally:
        W = jnp.ones(3)


def test_closure_array_rebound_is_seen():
    w = jnp.ones(3)
    f = bw.filter_jit(lambda x: w @ x)
    x = jnp.ones(3)
    assert f(x) == 3.0
    w = w * 3
    assert f(x) == 9.0
    assert f.cache_info() == bw.CacheInfo(hits=1, misses=1, traces=1, size=1)


def test_global_module_rebound_and_new_structure_explained(getkey):
    global MODEL
    MODEL = nn.Linear(2, 1, key=getkey())

    @bw.filter_jit(explain=True)
    def predict(x):
        return MODEL(x)

    x = jnp.ones(2)
    try:
        predict(x)
        MODEL = nn.Linear(2, 1, key=getkey())
        np.testing.assert_allclose(predict(x), MODEL(x), rtol=1e-6)
        assert predict.cache_info().traces == 1
        MODEL = nn.Linear(4, 1, key=getkey())
        with pytest.warns(
            bw.RecompileWarning,
            match=r"global 'MODEL'\.weight: f32\[1,2\] -> f32\[1,4\]",
        ):
            np.testing.assert_allclose(predict(jnp.ones(4)), MODEL(jnp.ones(4)))
    finally:
        MODEL = None


def test_nested_pytree_global_nested_function_and_helper():
    global PARAMS, W

    @bw.filter_jit
    def f(x):
        def inner():  # a function defined inside reads the global
            return PARAMS["w"] * x + PARAMS["b"][0]

        return inner() + _uses_helper(x)

    x = jnp.ones(2)
    saved = PARAMS, W
    try:
        W = jnp.ones(2)
        np.testing.assert_allclose(f(x), [3.0, 3.0])
        PARAMS = {"w": jnp.ones(2) * 5, "b": (jnp.ones(()),)}
        W = jnp.ones(2) * 10
        np.testing.assert_allclose(f(x), [17.0, 17.0])
        assert f.cache_info().traces == 1
    finally:
        PARAMS, W = saved


def test_changed_non_array_global_retraces_with_the_new_value():
    global LR
    f = bw.filter_jit(lambda x: x * LR, explain=True)
    x = jnp.ones(())
    try:
        assert f(x) == pytest.approx(0.1)
        LR = 0.0
        with pytest.warns(bw.RecompileWarning, match=r"  global 'LR': 0\.1 -> 0\.0$"):
            assert f(x) == 0.0
        LR = 1.0  # a second change: traced again, explained by its last change
        with pytest.warns(bw.RecompileWarning, match=r"  global 'LR': 0\.0 -> 1\.0$"):
            assert f(x) == 1.0
        assert f(x) == 1.0
        assert f.cache_info() == (1, 3, 3, 3)
    finally:
        LR = 0.1


def test_equal_value_rebound_does_not_warn():
    global LR
    f = bw.filter_jit(lambda x: x * LR)
    f(jnp.ones(()))
    LR = float("0.1")  # re-running a notebook cell
    f(jnp.ones(()))


def test_capture_constants_is_jax_behaviour():
    w = jnp.ones(3)
    f = bw.filter_jit(lambda x: w @ x, capture="constants")
    x = jnp.ones(3)
    assert f(x) == 3.0
    w = w * 3  # noqa: F841 (read by the lambda)
    assert f(x) == 3.0
    j = jax.jit(lambda x: w @ x)
    assert j(x) == 9.0


def test_capture_argument_is_checked():
    with pytest.raises(ValueError, match=r"capture=.*'inputs', 'constants'.*'arrays'"):
        bw.filter_jit(lambda x: x, capture="arrays")


def test_function_state_is_not_watched():
    global COUNT
    traces = 0

    @bw.filter_jit
    def f(x):
        nonlocal traces
        traces += 1
        return _counts(x)

    f(jnp.ones(2))
    f(jnp.ones(2))  # `traces` and `COUNT` changed: no warning, they are state
    assert traces == 1 and COUNT >= 1


def _add_w(x, y):
    return x + W, y + W


@pytest.mark.parametrize("donate", ["all", "all-except-first", "warn"])
def test_captured_arrays_are_not_donated(donate):
    f = bw.filter_jit(_add_w, donate=donate)
    x, y = jnp.zeros(3), jnp.zeros(3)
    f(x, y)
    assert not W.is_deleted()
    assert y.is_deleted()
    assert x.is_deleted() == (donate != "all-except-first")


def test_unhashable_static_inside_capture_is_named():
    cfg = (jnp.ones(2), {1, 2})  # a set is an unhashable leaf
    f = bw.filter_jit(lambda x: cfg[0] * x)
    with pytest.raises(TypeError, match=r"at `closure 'cfg'\[1\]` \(of type set\)"):
        f(jnp.ones(2))


def test_threads_share_one_trace(getkey):
    model = nn.Linear(2, 2, key=getkey())
    f = bw.filter_jit(lambda x: model(x))
    xs = [jnp.full(2, float(i)) for i in range(8)]
    out = [None] * 8

    def run(i):
        for _ in range(5):
            out[i] = f(xs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        np.testing.assert_allclose(out[i], model(xs[i]), rtol=1e-6)
    assert f.cache_info().traces == 1


def test_captured_objects_die_with_the_wrapper(getkey):
    def make():
        model = nn.Linear(2, 2, key=getkey())
        f = bw.filter_jit(lambda x: model(x))
        f(jnp.ones(2))
        return f, weakref.ref(model), weakref.ref(model.weight)

    f, model_ref, weight_ref = make()
    assert model_ref() is not None
    del f
    gc.collect()
    assert model_ref() is None and weight_ref() is None


def test_filter_grad_and_vmap_inside(getkey):
    model = nn.Linear(2, 1, key=getkey())
    scale = jnp.asarray(2.0)

    def loss(m, x):
        return scale * jnp.sum(m(x) ** 2)

    @bw.filter_jit
    def step(x):
        grads = bw.filter_grad(loss)(model, x)
        per_row = bw.filter_vmap(lambda r: model(r))(jnp.stack([x, x]))
        return grads.weight, per_row

    x = jnp.ones(2)
    g, rows = step(x)
    np.testing.assert_allclose(g, bw.filter_grad(loss)(model, x).weight, rtol=1e-6)
    scale = jnp.asarray(3.0)  # noqa: F841 (read by `loss`)
    model = nn.Linear(2, 1, key=getkey())
    g, rows = step(x)
    np.testing.assert_allclose(g, bw.filter_grad(loss)(model, x).weight, rtol=1e-6)
    np.testing.assert_allclose(rows[0], model(x), rtol=1e-6)
    assert step.cache_info().traces == 1


def test_method_reads_global():
    global W

    class Scale(bw.Module):
        k: jax.Array

        @bw.filter_jit
        def __call__(self, x):
            return self.k * W * x

    s = Scale(jnp.asarray(2.0))
    saved = W
    try:
        W = jnp.ones(2)
        np.testing.assert_allclose(s(jnp.ones(2)), [2.0, 2.0])
        W = jnp.ones(2) * 4
        np.testing.assert_allclose(s(jnp.ones(2)), [8.0, 8.0])
    finally:
        W = saved


def test_keyword_arguments_and_unbound_names():
    f = bw.filter_jit(lambda x, *, y: x * later + y)  # noqa: F821
    with pytest.raises(NameError, match="later"):
        f(jnp.ones(()), y=1.0)
    globals()["later"] = jnp.asarray(2.0)
    try:
        assert f(jnp.ones(()), y=jnp.asarray(1.0)) == 3.0
    finally:
        del globals()["later"]


def test_wrong_arguments_name_the_function():
    w = jnp.ones(2)

    def predict(x):
        return w * x

    f = bw.filter_jit(predict)
    with pytest.raises(TypeError, match=r"predict\(\) takes 1 positional argument"):
        f(jnp.ones(2), jnp.ones(2))
    np.testing.assert_allclose(f(x=jnp.ones(2)), [1.0, 1.0])  # keywords still work


def test_numpy_array_mutated_in_place_is_read_each_call():
    table = np.ones(3, np.float32)
    f = bw.filter_jit(lambda x: jnp.sum(table) * x)
    assert f(jnp.ones(())) == 3.0
    table[0] = 5.0
    assert f(jnp.ones(())) == 7.0


def test_nothing_watched_means_no_layer():
    f = bw.filter_jit(lambda m, x: jnp.sin(m(x)) + len(x))  # jnp, len: not watched
    assert f._boxwood_jit.call is f
    g = bw.filter_jit(lambda x: W * x)
    assert g._boxwood_jit.call is not g


def test_jitted_helper_is_inlined_so_its_captures_are_seen(getkey):
    model = nn.Linear(2, 1, key=getkey())
    predict = bw.filter_jit(lambda x: model(x))

    @bw.filter_jit
    def evaluate(x):
        return predict(x) * 2

    x = jnp.ones(2)
    np.testing.assert_allclose(evaluate(x), model(x) * 2, rtol=1e-6)
    model = nn.Linear(2, 1, key=getkey())
    np.testing.assert_allclose(evaluate(x), model(x) * 2, rtol=1e-6)
    np.testing.assert_allclose(predict(x), model(x), rtol=1e-6)
    assert evaluate.cache_info().traces == 1


def test_an_inlined_jitted_helper_keeps_its_wrapper_attributes(getkey):
    """Inside the trace of a function that reads it, a `filter_jit` wrapper is its
    function run inline, and still has the wrapper's attributes: `__wrapped__`
    (what Equinox programs call to reach the plain function), its name,
    `cache_info` and `lower`; the user's own function gains none of them."""
    model = nn.Linear(2, 1, key=getkey())

    def plain(x):
        return model(x)

    predict = bw.filter_jit(plain)
    seen = {}

    @bw.filter_jit
    def evaluate(x):
        seen["name"], seen["lower"] = predict.__name__, predict.lower
        seen["cache_info"] = predict.cache_info
        return predict.__wrapped__(x) * 2 + predict(x)

    x = jnp.ones(2)
    np.testing.assert_allclose(evaluate(x), model(x) * 3, rtol=1e-6)
    model = nn.Linear(2, 1, key=getkey())  # the plain function's capture is seen
    np.testing.assert_allclose(evaluate(x), model(x) * 3, rtol=1e-6)
    assert seen == {
        "name": "plain",
        "lower": predict.lower,
        "cache_info": predict.cache_info,
    }
    assert not hasattr(plain, "__wrapped__") and not hasattr(plain, "lower")
    assert evaluate.cache_info().traces == 1


def test_method_using_super_is_not_watching_its_class():
    class Base(bw.Module):
        def scale(self):
            return 2.0

    class Scaled(Base):
        k: jax.Array

        @bw.filter_jit
        def __call__(self, x):
            return super().scale() * self.k * W[0] * x

    assert Reads(Scaled.__call__.__wrapped__).cells == []
    assert Scaled(jnp.asarray(3.0))(jnp.asarray(1.0)) == 6.0


def test_lower_passes_the_captured_values():
    w = jnp.ones((2, 3))
    f = bw.filter_jit(lambda x: w @ x)
    main = "func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>)"
    assert main in f.lower(jnp.ones(3)).as_text()  # an input, not a constant
    g = bw.filter_jit(lambda x: w @ x, capture="constants")
    assert "@main(%arg0: tensor<3xf32>)" in g.lower(jnp.ones(3)).as_text()


# ------------------------------------------------- bound methods and partials
@jax.tree_util.register_pytree_node_class
class _Scaler:
    """A plain Python pytree (not a boxwood module) with methods."""

    def __init__(self, w):
        self.w = w

    def tree_flatten(self):
        return (self.w,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def times(self, x):
        return self.w * x

    def plus(self, x):
        return self.w + x


def test_partial_holding_arrays_is_an_input(getkey):
    import functools

    def loss(model, x, scale):
        return model(x) * scale

    model = nn.Linear(2, 1, key=getkey())
    apply = functools.partial(loss, model, scale=2.0)
    f = bw.filter_jit(lambda x: apply(x), explain=True)
    x = jnp.ones(2)
    np.testing.assert_allclose(f(x), loss(model, x, 2.0), rtol=1e-6)
    other = nn.Linear(2, 1, key=getkey())
    apply = functools.partial(loss, other, scale=2.0)  # same structure: no retrace
    np.testing.assert_allclose(f(x), loss(other, x, 2.0), rtol=1e-6)
    assert f.cache_info().traces == 1
    apply = functools.partial(loss, other, scale=3.0)  # a static value: retrace
    with pytest.warns(bw.RecompileWarning, match=r"closure 'apply'\[1\]\['scale'\]"):
        np.testing.assert_allclose(f(x), loss(other, x, 3.0), rtol=1e-6)
    # a partial without arrays is a trace-time constant, keyed by identity
    add = functools.partial(jnp.add, 1.0)
    g = bw.filter_jit(lambda x: add(x))
    assert g(jnp.zeros(())) == 1.0
    add = functools.partial(jnp.add, 2.0)  # another object: traced again
    assert g(jnp.zeros(())) == 2.0


def test_bound_method_of_a_pytree_is_an_input():
    scaler = _Scaler(jnp.full(2, 3.0))
    method = scaler.times
    f = bw.filter_jit(lambda x: method(x), explain=True)
    x = jnp.ones(2)
    assert f(x).tolist() == [3.0, 3.0]
    method = _Scaler(jnp.full(2, 5.0)).times  # another object: no retrace
    assert f(x).tolist() == [5.0, 5.0]
    assert f.cache_info().traces == 1
    method = _Scaler(jnp.full(2, 5.0)).plus  # another function: retraced
    with pytest.warns(
        bw.RecompileWarning,
        match=r"captured callables: .*bound method of _Scaler\.times.* -> "
        r".*bound method of _Scaler\.plus",
    ):
        assert f(x).tolist() == [6.0, 6.0]
    assert f.cache_info().traces == 2
    method = _Scaler(jnp.full(2, 7.0)).times  # back to the first: compiled already
    assert f(x).tolist() == [7.0, 7.0]
    assert f.cache_info().traces == 2
