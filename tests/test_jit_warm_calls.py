"""The C extension (`boxwood._native._speedups`): built, switchable, and safe with references.

Behaviour is tested on both paths by the `call_path` fixture (conftest.py) in the
jit, rebuild and flat-cache tests; this file checks what only the C side can get
wrong: reference counts, objects kept alive, malformed input, and the class slot
that rebuilds modules.
"""

import gc
import inspect
import os
import subprocess
import sys
import weakref

import jax
import jax.numpy as jnp
import optax
import pytest

import boxwood as bw
from boxwood._config import env_flag

# the C extension's own tests: skipped where it was not built (no C compiler)
pytest.importorskip(
    "boxwood._native._speedups", reason="boxwood's C extension is not built"
)

pytestmark = pytest.mark.usefixtures("call_path")


class Lin(bw.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float = bw.field(static=True, default=1.0)

    def __call__(self, x):
        return self.scale * (self.weight @ x + self.bias)


def _lin(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return Lin(jax.random.normal(k1, (3, 3)), jax.random.normal(k2, (3,)))


def test_extension_is_built_unless_switched_off():
    pure = env_flag("BOXWOOD_PURE_PYTHON")
    code = "from boxwood import _native; print(_native.active())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ("False" if pure else "True")
    env = {**os.environ, "BOXWOOD_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    assert out == "False"


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
    few, lots = (x, x), (x,) * 20  # the C path's stack buffer, and the heap
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


def test_builder_rejects_malformed_programs():
    from boxwood._jit._rebuild import FLAT, OPCODES
    from boxwood._native._speedups import (
        Builder,  # built (test above), whatever the switch
    )

    def build(program):
        return Builder(program, FLAT, **OPCODES)

    with pytest.raises(TypeError, match="malformed program"):
        build((99, 0))([])
    with pytest.raises(TypeError, match="the leaves must be a list"):
        build((0, 0))((1,))
    with pytest.raises(IndexError):
        build((0, 5))([1])


def test_builder_takes_its_opcodes_from_python():
    from boxwood._jit._rebuild import FLAT, OPCODES
    from boxwood._native._speedups import Builder

    # renumbered opcodes: the C builder follows what it is handed
    shifted = {name: op + 10 for name, op in OPCODES.items()}
    program = (shifted["tuple"], ((shifted["leaf"], 1), (shifted["const"], "c")))
    assert Builder(program, FLAT, **shifted)(["a", "b"]) == ("b", "c")
    with pytest.raises(TypeError, match="malformed program node"):
        Builder(program, FLAT, **OPCODES)(["a", "b"])  # 13 is no opcode there
    with pytest.raises(ValueError, match="opcodes must be distinct"):
        Builder(program, FLAT, **{**OPCODES, "const": OPCODES["leaf"]})


def test_fast_call_reads_fields_through_the_descriptors_it_is_given():
    from boxwood._native._speedups import FastCall

    with pytest.raises(TypeError, match="fields must be descriptors"):
        FastCall(
            fallback=print, plans={}, store=object(), walk=print,
            after_trace=print, on_error=print, array_type=jax.Array,
            array_token=object(), none_token=object(), module_types=set(),
            walkable={}, fun_dyn=None, split_first=False, first_name=None,
            flat_key="f", entry_cold="cold", entry_jitted="jitted",
            entry_fast_build="fast_build", entry_output=print, plan_n_first="n",
            store_traces="traces", store_tracing="tracing", name="f",
        )  # fmt: skip


def test_fast_call_checks_what_it_is_given_to_watch(call_path):
    from boxwood._jit.capture import CallState
    from boxwood._native._speedups import FastCall

    core = bw.filter_jit(lambda x: x + 1)._boxwood_jit
    if call_path == "python":  # no `FastCall` was built for it
        assert core._fast is None and core.watching(None, (), (), print) is None
        return
    good = dict(
        core._fast_kwargs, watch=object(), watch_snap=CallState.snap,
        watch_fallback=print,
    )  # fmt: skip
    bad = [
        {"watch_sources": ({},), "watch_keys": (None,)},  # a dict needs a name
        {"watch_sources": (object(),), "watch_keys": (None,)},  # not a cell
        {"watch_sources": ({},), "watch_keys": ("a", "b")},  # lengths differ
        {"watch_sources": ({},), "watch_keys": (1,)},  # a name must be a str
        {"watch_sources": (), "watch_keys": (), "watch_snap": "snap"},
        {"watch_sources": (), "watch_keys": (), "watch_fallback": 3},
    ]
    for kwargs in bad:
        with pytest.raises(TypeError, match="FastCall: watch needs watch_snap"):
            FastCall(**{**good, **kwargs})
    held = 1
    cell = (lambda: held).__closure__[0]
    watching = FastCall(**good, watch_sources=({}, cell), watch_keys=("a", None))
    # rewatching takes the same pairs, checked the same way
    for sources, keys in [(({},), (None,)), ((cell,), ("a",)), (({},), ("a", "b"))]:
        with pytest.raises(TypeError, match="FastCall._rewatch: a watching FastCall"):
            watching._rewatch(sources, keys)
    watching._rewatch(({}, cell), ("b", None))  # accepted
    plain = FastCall(**core._fast_kwargs)
    with pytest.raises(TypeError, match="FastCall._rewatch: a watching FastCall"):
        plain._rewatch((), ())


def test_lists_and_dicts_inside_arguments_take_the_fast_path(monkeypatch):
    from boxwood._jit import _wrapper as _jit

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


def test_install_call_takes_only_a_metaclass_with_a_python_call():
    from boxwood._module._module import SLOTTED, _ModuleMeta
    from boxwood._module._register import REBUILD_NAME
    from boxwood._module._static_key import StaticKey
    from boxwood._native._speedups import install_call

    install_call(_ModuleMeta, REBUILD_NAME, StaticKey, SLOTTED)  # (a no-op: installed)

    class NoCall(type):  # `type`'s own C __call__
        pass

    with pytest.raises(TypeError, match="must be defined in Python"):
        install_call(NoCall, REBUILD_NAME, StaticKey, set())
    with pytest.raises(TypeError, match="a metaclass defined in Python expected"):
        install_call(dict, REBUILD_NAME, StaticKey, set())

    class OtherMeta(type):
        def __call__(cls, *args, **kwargs):
            return super().__call__(*args, **kwargs)

    with pytest.raises(ValueError, match="one metaclass only"):
        install_call(OtherMeta, REBUILD_NAME, StaticKey, set())

    class Installed(bw.Module):
        w: jax.Array

    # a user's construction and JAX's rebuild both work
    m = Installed(jnp.ones(2))
    assert jnp.allclose(jax.tree_util.tree_map(lambda a: a + 1, m).w, 2.0)
