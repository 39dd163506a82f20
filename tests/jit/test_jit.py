import collections
import dataclasses
import gc
import threading
import warnings
import weakref
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import boxwood as bw

# every test runs on the compiled and the Python warm-call path (conftest.py)


class Linear(bw.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = bw.field(static=True, default=jnp.tanh)

    def __call__(self, x):
        return self.activation(self.weight @ x + self.bias)


class Drop(bw.Module):
    p: float = bw.field(static=True, default=0.5)
    inference: bool = bw.field(static=True, default=False)

    def __call__(self, x, key):
        if self.inference:
            return x
        keep = jax.random.bernoulli(key, 1 - self.p, x.shape)
        return jnp.where(keep, x / (1 - self.p), 0.0)


class Net(bw.Module):
    layers: list

    def __call__(self, x, key):
        for layer in self.layers:
            x = layer(x, key) if isinstance(layer, Drop) else layer(x)
        return x


class EqxLinear(eqx.Module):
    weight: jax.Array
    scale: float = eqx.field(static=True)

    def __call__(self, x):
        return self.scale * (self.weight @ x)


class PlainConfig:
    """An arbitrary object (not a pytree) holding hashable configuration."""

    def __init__(self, size):
        self.size = size

    def __hash__(self):
        return hash(self.size)

    def __eq__(self, other):
        return isinstance(other, PlainConfig) and other.size == self.size


def linear(key, n):
    k1, k2 = jax.random.split(key)
    return Linear(jax.random.normal(k1, (n, n)) / n, jax.random.normal(k2, (n,)))


def counting(fn):
    counter = {"n": 0}

    def wrapped(*args, **kwargs):
        counter["n"] += 1
        return fn(*args, **kwargs)

    return wrapped, counter


@jax.numpy_dtype_promotion("standard")  # optax's Adam mixes int32 counts and floats
def test_seed_scenario_three_models_three_states(getkey):
    model1 = linear(getkey(), 3)
    model2 = EqxLinear(jnp.eye(3), 2.0)
    model3 = PlainConfig(3)
    opt = optax.adam(1e-2)
    p1, p2 = opt.init(model1), opt.init(model2)
    p3 = {"step": jnp.zeros((), jnp.int32)}

    def train_step(model1, model2, model3, p1, p2, p3, batch, key):
        def loss(m1, m2):
            noise = jax.random.normal(key, batch.shape)
            out = jax.vmap(lambda x: m2(m1(x)))(batch + noise)
            return jnp.mean(out**2) * model3.size

        (g1, g2) = jax.grad(loss, argnums=(0, 1))(model1, model2)
        u1, p1 = opt.update(g1, p1)
        u2, p2 = opt.update(g2, p2)
        p3 = {"step": p3["step"] + 1}
        return (
            optax.apply_updates(model1, u1),
            optax.apply_updates(model2, u2),
            p1,
            p2,
            p3,
        )

    fn, count = counting(train_step)
    step = bw.filter_jit(fn)
    batch = jnp.ones((4, 3))
    out = step(model1, model2, model3, p1, p2, p3, batch, getkey())
    assert count["n"] == 1
    out2 = step(model1, model2, model3, p1, p2, p3, batch * 2, getkey())
    assert count["n"] == 1
    m1, m2, p1b, p2b, p3b = out2
    assert isinstance(m1, Linear) and isinstance(m2, EqxLinear) and m2.scale == 2.0
    assert int(p3b["step"]) == 1
    # feeding the outputs back in does not recompile either
    step(*out[:2], model3, *out[2:], batch, getkey())
    assert count["n"] == 1
    assert step.cache_info() == bw.CacheInfo(hits=2, misses=1, traces=1, size=1)


def test_train_eval_alternation_traces_exactly_twice(getkey):
    net = Net([linear(getkey(), 4), Drop(0.5), linear(getkey(), 4)])
    eval_net = bw.tree_at(lambda n: n.layers[1], net, Drop(0.5, inference=True))

    def step(model, x, key):
        return model(x, key)

    fn, count = counting(step)
    jitted = bw.filter_jit(fn)
    x = jnp.ones(4)
    for i in range(100):
        jitted(net if i % 2 else eval_net, x, jax.random.key(i))
    assert count["n"] == 2
    assert jitted.cache_info().traces == 2 and jitted.cache_info().hits == 98


def test_matches_eager_and_returns_static_outputs_as_is(getkey):
    model = linear(getkey(), 3)
    marker = object()

    def f(model, x, scale, name, marker):
        return {"y": model(x) * scale, "name": name, "marker": marker, "none": None}

    out = bw.filter_jit(f)(model, jnp.ones(3), 2.0, "abc", marker)
    expected = f(model, jnp.ones(3), 2.0, "abc", marker)
    assert jnp.allclose(out["y"], expected["y"])
    assert out["name"] == "abc" and out["marker"] is marker and out["none"] is None


def test_python_scalars_are_static():
    fn, count = counting(lambda x, s: x * s)
    f = bw.filter_jit(fn)
    assert float(f(jnp.ones(()), 2.0)) == 2.0
    f(jnp.ones(()), 2.0)
    assert count["n"] == 1
    assert float(f(jnp.ones(()), 3.0)) == 3.0
    assert count["n"] == 2
    f(jnp.ones(()), jnp.asarray(3.0))
    f(jnp.ones(()), jnp.asarray(4.0))
    assert count["n"] == 3


def test_shape_dtype_and_structure_changes_retrace():
    fn, count = counting(lambda t: jax.tree_util.tree_map(lambda a: a + 1, t))
    f = bw.filter_jit(fn)
    f([jnp.ones(2)])
    f([jnp.ones(3)])
    f([jnp.ones(3, jnp.int32)])
    f([jnp.ones(3), jnp.ones(3)])
    f((jnp.ones(3), jnp.ones(3)))
    assert count["n"] == 5
    for t in ([jnp.ones(2)], [jnp.ones(3)], [jnp.ones(3), jnp.ones(3)]):
        f(t)
    assert count["n"] == 5
    assert f.cache_info().size == 5


def test_output_structure_depending_on_shapes():
    f = bw.filter_jit(lambda x: (x.shape[0], x + 1))
    n2, y2 = f(jnp.ones(2))
    n3, y3 = f(jnp.ones(3))
    assert (n2, n3) == (2, 3)
    assert f(jnp.ones(2))[0] == 2 and y3.shape == (3,)


def test_numpy_inputs_are_traced_and_outputs_become_jax_arrays():
    fn, count = counting(lambda x: x * 2)
    f = bw.filter_jit(fn)
    out = f(np.ones(2, np.float32))
    f(np.full(2, 3.0, np.float32))
    assert count["n"] == 1 and isinstance(out, jax.Array)


def test_decorator_forms_and_method():
    @bw.filter_jit
    def a(x):
        return x + 1

    @bw.filter_jit(donate="none")
    def b(x):
        return x + 2

    class M(bw.Module):
        w: jax.Array

        @bw.filter_jit
        def apply(self, x):
            return self.w * x

    assert float(a(jnp.ones(()))) == 2 and float(b(jnp.ones(()))) == 3
    assert a.__name__ == "a"
    assert float(M(jnp.asarray(3.0)).apply(jnp.asarray(2.0))) == 6.0


def test_bad_arguments():
    with pytest.raises(
        ValueError, match=r"`filter_jit\(donate=...\)` must be one of 'none', 'all'"
    ):
        bw.filter_jit(lambda x: x, donate="yes")
    with pytest.raises(
        TypeError,
        match=r"unexpected keyword argument\(s\) \['static_argnums'\].*static automatically",
    ):
        bw.filter_jit(lambda x: x, static_argnums=0)
    with pytest.raises(TypeError, match="expects a callable, got int"):
        bw.filter_jit(3)


def test_unhashable_static_leaf_names_the_path():
    class Config:
        def __init__(self):
            self.sizes = [1, 2]

        def __eq__(self, other):
            return True

        __hash__ = None

    @dataclasses.dataclass
    class Holder:  # dataclass equality makes it unhashable
        config: Config = dataclasses.field(default_factory=Config)

    f = bw.filter_jit(lambda x, c: x)
    with pytest.raises(
        TypeError,
        match=r"value at `args\[1\].sizes` \(of type list\) is not hashable.*tuple instead of a list",
    ):
        f(jnp.ones(1), Config())
    with pytest.raises(TypeError, match=r"`kwargs\['h'\].config.sizes`"):
        bw.filter_jit(lambda x, h: x)(jnp.ones(1), h=Holder())


def test_cache_info_and_clear_cache():
    fn, count = counting(lambda x: x + 1)
    f = bw.filter_jit(fn)
    f(jnp.ones(1))
    f(jnp.ones(1))
    assert f.cache_info() == (1, 1, 1, 1)
    f.clear_cache()
    assert f.cache_info() == (0, 0, 0, 0)
    f(jnp.ones(1))
    assert count["n"] == 2 and f.cache_info().misses == 1


def test_each_wrapper_counts_its_own_traces():
    f = bw.filter_jit(lambda x: x + 1)
    g = bw.filter_jit(lambda x: x + 2)
    f(jnp.ones(1))
    f(jnp.ones(2))
    g(jnp.ones(1))
    assert f.cache_info().traces == 2 and g.cache_info().traces == 1


def test_rewrapping_the_same_function_reuses_compilation():
    fn, count = counting(lambda x: x * 2)
    # (kept alive: a wrapper's compiled code is shared while some wrapper of the
    # function lives, and a dropped wrapper dies at the next garbage collection)
    wrappers = [bw.filter_jit(fn) for _ in range(3)]
    for wrapped in wrappers:
        wrapped(jnp.ones(2))
    assert count["n"] == 1


def test_rewrapping_the_same_function_after_its_cache_died_does_not_warn():
    def fun(x):
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(8):
            bw.filter_jit(fun)(jnp.ones(1))
            gc.collect()


def test_rewrapping_fresh_functions_in_a_loop_warns_once(monkeypatch):
    from boxwood._jit import _cache as _jit_cache

    monkeypatch.setattr(_jit_cache, "_WRAPS_AT_SITE", collections.OrderedDict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            bw.filter_jit(lambda x: x + 1)(jnp.ones(1))
    churn = [w for w in caught if issubclass(w.category, bw.PerformanceWarning)]
    assert len(churn) == 1
    assert "Each new wrapper of a new function object compiles again" in str(
        churn[0].message
    )
    assert churn[0].filename == __file__


def test_recompile_warning_texts(getkey):
    net = Net([linear(getkey(), 4), Drop(0.5), linear(getkey(), 4)])
    eval_net = bw.tree_at(lambda n: n.layers[1], net, Drop(0.5, inference=True))
    f = bw.filter_jit(lambda model, s, *, x, key: model(x, key) * s, explain=True)
    key = getkey()
    f(net, 0.1, x=jnp.ones(4), key=key)
    with pytest.warns(
        bw.RecompileWarning, match=r"args\[0\].layers\[1\].inference: False -> True"
    ) as rec:
        f(eval_net, 0.1, x=jnp.ones(4), key=key)
    assert rec[0].filename == __file__
    with pytest.warns(
        bw.RecompileWarning,
        match=r"args\[1\]: Python float 0.1 -> Python float 0.2 \(non-array leaves are static; pass jnp.asarray\(...\) to trace it\)",
    ):
        f(eval_net, 0.2, x=jnp.ones(4), key=key)
    g = bw.filter_jit(lambda x: jax.tree_util.tree_leaves(x)[0].sum(), explain=True)
    g(jnp.ones((32, 8)))
    with pytest.warns(
        bw.RecompileWarning, match=r"args\[0\]: f32\[32,8\] -> f32\[16,8\]"
    ):
        g(jnp.ones((16, 8)))
    with pytest.warns(bw.RecompileWarning, match=r"args\[0\]: structure changed"):
        g([jnp.ones((16, 8))])


def test_recompile_warning_kwargs_path_and_global_config(monkeypatch):
    f = bw.filter_jit(lambda *, x: x.sum())
    f(x=jnp.ones((32, 8)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(x=jnp.ones((8, 8)))  # explanations are off by default
    monkeypatch.setattr(bw.config, "explain_recompiles", True)
    with pytest.warns(
        bw.RecompileWarning, match=r"kwargs\['x'\]: f32\[(32|8),8\] -> f32\[16,8\]"
    ):
        f(x=jnp.ones((16, 8)))


def test_explain_env_variable(monkeypatch):
    # `boxwood.config` is `Config()` built at import: built the same way here,
    # with the variable set, rather than importing boxwood in a child process
    monkeypatch.setenv("BOXWOOD_EXPLAIN_RECOMPILES", "1")
    assert type(bw.config)().explain_recompiles is True
    monkeypatch.delenv("BOXWOOD_EXPLAIN_RECOMPILES")
    assert type(bw.config)().explain_recompiles is False


def test_donation_deletes_input_buffers():
    f = bw.filter_jit(
        lambda m, x: (jax.tree_util.tree_map(lambda a: a + 1, m), x * 2), donate="all"
    )
    model = {"w": jnp.ones(3)}
    x = jnp.ones(2)
    new_model, y = f(model, x)
    assert model["w"].is_deleted() and x.is_deleted()
    assert not new_model["w"].is_deleted()
    g = bw.filter_jit(lambda m, x: (m["w"] + 1, x * 2), donate="all-except-first")
    model, x = {"w": jnp.ones(3)}, jnp.ones(2)
    g(model, x)
    assert not model["w"].is_deleted() and x.is_deleted()


def test_donate_warn_names_undonatable_buffers():
    f = bw.filter_jit(lambda x, y: x + 1, donate="warn")
    with pytest.warns(
        UserWarning,
        match=r"1 input buffer\(s\) could not be donated.*args\[1\] f32\[5\]",
    ):
        f(jnp.ones(3), jnp.ones(5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bw.filter_jit(lambda x, y: x + 1, donate="all")(jnp.ones(3), jnp.ones(5))


def test_no_leak_of_arguments_or_function(getkey):
    model = linear(getkey(), 3)
    ref = weakref.ref(model)
    weight_ref = weakref.ref(model.weight)
    f = bw.filter_jit(lambda m, x: m(x))
    f(model, jnp.ones(3))
    del model
    gc.collect()
    assert ref() is None and weight_ref() is None

    def fun(x):
        return x + 1

    fun_ref = weakref.ref(fun)
    g = bw.filter_jit(fun)
    g(jnp.ones(1))
    del fun, g
    gc.collect()
    assert fun_ref() is None


def test_thread_safety_one_trace_per_signature():
    barrier = threading.Barrier(8)
    fn, count = counting(lambda x: jnp.sin(x) * 2)
    f = bw.filter_jit(fn)
    results = [None] * 8
    errors = []

    def work(i):
        try:
            barrier.wait()
            x = jnp.full((2 + i % 2,), float(i))
            results[i] = (f(x), x)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for out, x in results:
        assert jnp.allclose(out, jnp.sin(x) * 2)
    assert count["n"] == 2
    assert f.cache_info().traces == 2


def test_async_dispatch_returns_before_result_is_ready():
    # products of n x n matrices in a loop, against a dispatch of well under a
    # millisecond: a few tenths of a second on a CPU (n = 512, 10 products) and
    # on an accelerator (n = 4096, 400 products: 0.36 s on a TPU v5e, where the
    # call returned in 0.2 ms). Off the CPU the suite sets BOXWOOD_SYNC_CHECKS=1,
    # which makes only a function with a check wait: this one has none.
    cpu = jax.default_backend() == "cpu"
    n, products = (512, 10) if cpu else (4096, 400)

    @bw.filter_jit
    def heavy(a):
        return jax.lax.fori_loop(0, products, lambda _, a: jnp.tanh(a @ a), a)

    a = jnp.ones((n, n)) / n
    heavy(a).block_until_ready()  # compile
    out = heavy(a)
    assert not out.is_ready()  # returned while the products still run
    out.block_until_ready()
    assert out.is_ready()


def test_bound_method_of_equinox_module():
    model = EqxLinear(jnp.eye(2), 3.0)
    f = bw.filter_jit(model.__call__)
    assert jnp.allclose(f(jnp.ones(2)), 3.0)


leaf = st.one_of(
    st.floats(-3, 3, width=32).map(lambda v: jnp.asarray(v, jnp.float32)),
    st.integers(-3, 3),
    st.sampled_from(["a", "b", None]),
)
pytrees = st.recursive(
    leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.sampled_from("xyz"), c, max_size=2)
    ),
    max_leaves=8,
)


def _double_plus_one(t):
    return jax.tree_util.tree_map(lambda v: v * 2 + 1 if bw.is_array(v) else v, t)


_jitted_double_plus_one = bw.filter_jit(_double_plus_one)


@settings(max_examples=30, deadline=None)
@given(pytrees)
def test_filter_jit_matches_eager_on_random_pytrees(tree):
    out = _jitted_double_plus_one(tree)
    assert bw.tree_equal(out, _double_plus_one(tree), typematch=True)


def test_donated_training_loop_keeps_live_buffers_constant(getkey):
    model = linear(getkey(), 8)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, model)
    batch = jnp.ones((16, 8))

    @bw.filter_jit(donate="all-except-first")
    def step(batch, model, velocity):
        grads = bw.filter_grad(lambda m: jnp.mean(jax.vmap(m)(batch) ** 2))(model)
        velocity = jax.tree_util.tree_map(lambda v, g: 0.9 * v + g, velocity, grads)
        model = jax.tree_util.tree_map(lambda p, v: p - 0.01 * v, model, velocity)
        return model, velocity

    first_weight = model.weight
    counts = []
    for i in range(200):
        model, velocity = step(batch, model, velocity)
        if i in (10, 199):
            jax.block_until_ready(model)
            counts.append(len(jax.live_arrays()))
    assert first_weight.is_deleted() and not batch.is_deleted()
    assert counts[0] == counts[1]
    assert step.cache_info().traces == 1


def test_bound_methods_as_arguments_are_traced_once(getkey):
    m1, m2 = linear(getkey(), 3), linear(getkey(), 3)
    fn, count = counting(lambda method, x: method(x))
    f = bw.filter_jit(fn)
    x = jnp.ones(3)
    assert jnp.allclose(f(m1.__call__, x), m1(x))
    assert jnp.allclose(f(m2.__call__, x), m2(x))  # the arrays are inputs
    assert count["n"] == 1


@pytest.mark.parametrize("how", ["module", "bound_method"])
def test_jitted_module_and_bound_method_take_the_fast_path(getkey, monkeypatch, how):
    from boxwood._jit import _dispatch as _wrapper

    flattens = []
    real = _wrapper._flatten
    monkeypatch.setattr(_wrapper, "_flatten", lambda t: flattens.append(1) or real(t))
    model = linear(getkey(), 3)
    f = bw.filter_jit(model if how == "module" else model.__call__)
    f.clear_cache()  # the store may be shared with an earlier test's wrapper
    x = jnp.ones(3)
    for i in range(4):
        if i == 2:
            before = len(flattens)
        assert jnp.allclose(f(x), model(x))
    assert len(flattens) == before  # warm calls walk, never flatten
    assert f.cache_info() == bw.CacheInfo(hits=3, misses=1, traces=1, size=1)


def test_donate_except_first_keeps_the_first_argument_passed_by_keyword():
    f = bw.filter_jit(
        lambda model, x: (model["w"] + 1, x * 2), donate="all-except-first"
    )
    for _ in range(2):
        model, x = {"w": jnp.ones(3)}, jnp.ones(3)
        f(model=model, x=x)
        assert not model["w"].is_deleted()
        assert x.is_deleted()


def test_deeply_nested_modules_on_every_call():
    class Wrap(bw.Module):
        inner: object

    model = jnp.ones(2)
    for _ in range(350):  # deeper than Python's recursion limit allows recursing
        model = Wrap(model)
    f = bw.filter_jit(lambda m: m)
    for _ in range(3):  # cold, second call (flat form remembered), fast path
        model = f(model)
    assert f.cache_info().traces == 1
    leaf = model
    for _ in range(350):
        leaf = leaf.inner
    assert jnp.array_equal(leaf, jnp.ones(2))


_identity = bw.filter_jit(lambda m: m)


@pytest.mark.parametrize("name", ["_NOT_GIVEN", "_construct", "set_dict", "_REBUILD"])
def test_fields_named_like_generated_code_work(name):
    cls = type(
        "Odd",
        (bw.Module,),
        {
            "__annotations__": {name: jax.Array, "b": int},
            "b": bw.field(static=True, default=1),
        },
    )
    obj = cls(**{name: jnp.ones(2)})
    for _ in range(3):
        obj = _identity(obj)
    assert jnp.array_equal(getattr(obj, name), jnp.ones(2)) and obj.b == 1


def test_reserved_field_names_are_rejected_at_class_creation():
    with pytest.raises(
        TypeError, match=r"`Bad._boxwood_flat`: field names starting with"
    ):

        class Bad(bw.Module):
            _boxwood_flat: jax.Array


def test_threads_tracing_distinct_structures_count_one_trace_each():
    n = 8
    barrier = threading.Barrier(n)
    fn, count = counting(lambda x: jnp.sin(x) * 2)
    f = bw.filter_jit(fn)
    errors = []

    def work(i):
        try:
            x = jnp.ones((i + 1,))
            barrier.wait()
            for _ in range(5):
                assert jnp.allclose(f(x), jnp.sin(x) * 2)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    info = f.cache_info()
    assert count["n"] == n and info.traces == n and info.misses == n
    assert info.hits + info.misses == 5 * n


def _branch_on_weight(model, x):
    if model.weight.sum() > 0:
        return x
    return -x


def test_tracer_errors_name_the_users_function_and_paths(getkey):
    model = linear(getkey(), 3)
    where = f"_branch_on_weight at {__file__}"
    cases = [
        (bw.filter_jit(_branch_on_weight), (model, jnp.ones(3)), {}, "args[0].weight"),
        (
            bw.filter_jit(_branch_on_weight),
            (),
            {"model": model, "x": jnp.ones(3)},
            "kwargs['model'].weight",
        ),
        (
            bw.filter_jit(_branch_on_weight, donate="all-except-first"),
            (model, jnp.ones(3)),
            {},
            "args[0].weight",
        ),
        (
            bw.filter_jit(bw.Partial(_branch_on_weight, model)),
            (jnp.ones(3),),
            {},
            "self.args[0].weight",
        ),  # the function's own arrays
    ]
    for f, args, kwargs, path in cases:
        with pytest.raises(jax.errors.TracerBoolConversionError) as info:
            f(*args, **kwargs)
        text = str(info.value)
        assert f"depends on the value of the argument {path}." in text
        assert "groups[" not in text and "_trace.py" not in text
        if not isinstance(f.__wrapped__, bw.Partial):
            assert where in text


def test_keyword_arguments_take_the_fast_path(getkey, monkeypatch):
    from boxwood._jit import _dispatch as _wrapper

    flattens = []
    real = _wrapper._flatten
    monkeypatch.setattr(_wrapper, "_flatten", lambda t: flattens.append(1) or real(t))
    fn, count = counting(lambda m, *, x, scale: (m, m(x) * scale))
    f = bw.filter_jit(fn)
    model = linear(getkey(), 3)
    for i in range(5):
        if i == 2:
            before = len(flattens)
        model, y = f(model, scale=2.0, x=jnp.ones(3))  # keyword order does not matter
    assert len(flattens) == before  # warm keyword calls walk, never flatten
    assert count["n"] == 1 and f.cache_info().hits == 4
    assert jnp.allclose(y, model(jnp.ones(3)) * 2.0)
    f(model, x=jnp.ones(3), scale=3.0)  # a new static value: traced again
    assert count["n"] == 2
