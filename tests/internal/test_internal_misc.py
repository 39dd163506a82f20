"""boxwood.internal's own helpers, beyond tests/internal/test_internal_helpers.py: progress
meters under vmap/grad/repeated runs, loop buffers' write paths, ContainerMeta,
float neighbours, scan_trick, Static, closure_to_pytree, GetKey, ω's updates, the
documentation helpers and finalisation."""

import inspect
import typing
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir

import boxwood as bw
import boxwood.internal as bwi

# --- progress meters ---------------------------------------------------------


def _count_to(meter, x, n=10):
    """A while loop of `n * x` steps reporting its progress to `meter`."""
    state = meter.init()

    def body(carry):
        i, s = carry
        return i + 1, meter.step(s, jnp.minimum((i + 1) / (n * x), 1.0))

    _, state = bwi.while_loop(
        lambda c: c[0] < n * x, body, (0, state), kind="checkpointed", max_steps=64
    )
    meter.close(state)
    return x * x


def _lines(capfd):
    jax.effects_barrier()
    return capfd.readouterr().out.split()


_TENTHS = [f"{10 * k:.2f}%" for k in range(11)]


def test_text_meter_follows_the_slowest_batch_element(capfd):
    meter = bwi.TextProgressMeter(minimum_increase=0.0999)
    capfd.readouterr()
    # element 0 ends after 10 steps, element 1 after 20: one display, following 1
    out = jax.jit(jax.vmap(lambda x: _count_to(meter, x)))(jnp.array([1.0, 2.0]))
    assert out.tolist() == [1.0, 4.0]
    assert _lines(capfd) == _TENTHS


def test_text_meter_each_run_has_its_own_display(capfd):
    meter = bwi.TextProgressMeter(minimum_increase=0.0999)
    f = jax.jit(lambda x: _count_to(meter, x))
    capfd.readouterr()
    f(1.0)
    f(1.0)
    assert _lines(capfd) == _TENTHS + _TENTHS


def test_text_meter_backward_pass_shows_nothing_more(capfd):
    # the checkpointed loop recomputes steps on the backward pass, after `close`
    meter = bwi.TextProgressMeter(minimum_increase=0.0999)
    capfd.readouterr()
    assert jax.grad(lambda x: _count_to(meter, x))(1.0) == 2.0
    assert _lines(capfd) == _TENTHS


def test_text_meter_close_completes_the_display(capfd):
    meter = bwi.TextProgressMeter(minimum_increase=0.5)

    @jax.jit
    def run():
        state = meter.init()
        for p in (0.3, 0.6, 0.9):
            state = meter.step(state, p)
        meter.close(state)
        return state.progress

    capfd.readouterr()
    assert np.isclose(run(), 0.6)
    assert _lines(capfd) == ["0.00%", "60.00%", "100.00%"]


def test_tqdm_meter_under_vmap_and_grad(capfd):
    pytest.importorskip("tqdm")
    meter = bwi.TqdmProgressMeter(refresh_steps=3)

    def frames():
        jax.effects_barrier()
        return capfd.readouterr().err.split("\r")

    capfd.readouterr()
    jax.jit(jax.vmap(lambda x: _count_to(meter, x)))(jnp.array([1.0, 2.0]))
    shown = frames()
    # one display (it starts once), ending at 100%
    assert sum(f.startswith("0.00%|") for f in shown) == 1
    assert shown[-1].startswith("100.00%|")
    assert jax.grad(lambda x: _count_to(meter, x))(1.0) == 2.0
    shown = frames()
    assert sum(f.startswith("0.00%|") for f in shown) == 1
    assert shown[-1].startswith("100.00%|")


def test_tqdm_meter_needs_tqdm(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tqdm" else real(n)
    )
    with pytest.raises(ValueError, match="needs `tqdm`: install it"):
        bwi.TqdmProgressMeter()


# --- loop buffers ------------------------------------------------------------


def test_buffer_at_set_plain_array_with_traced_pred():
    f = jax.jit(lambda p: bwi.buffer_at_set(jnp.zeros(3), 1, 4.0, pred=p))
    assert f(True).tolist() == [0.0, 4.0, 0.0]
    assert f(False).tolist() == [0.0, 0.0, 0.0]
    dropped = bwi.buffer_at_set(jnp.zeros(2), 5, 1.0, pred=True, mode="drop")
    assert dropped.tolist() == [0.0, 0.0]


def test_buffer_view_attributes_and_indexing_options():
    seen = {}

    def body(c):
        i, buf = c
        seen.update(shape=buf.shape, ndim=buf.ndim, size=buf.size, dtype=buf.dtype)
        seen["first"] = buf.at[0].get()
        with pytest.raises(AttributeError, match="nope"):
            buf.nope  # noqa: B018
        # an indexing option takes the whole-buffer path; `pred` still gates it
        buf = buf.at[i + 5].set(9.0, pred=i > 0, mode="drop")
        buf = bwi.buffer_at_set(buf, i, 2.0 + i, pred=i != 1, mode="clip")
        return i + 1, buf

    _, out = bwi.while_loop(
        lambda c: c[0] < 3, body, (0, jnp.ones(3)), buffers=lambda c: c[1], kind="lax"
    )
    assert out.tolist() == [2.0, 1.0, 4.0]
    assert seen["shape"] == (3,) and seen["ndim"] == 1 and seen["size"] == 3
    assert seen["dtype"] == jnp.float32


@pytest.mark.parametrize("kind", ["lax", "checkpointed"])
def test_nested_loops_write_through_to_the_outer_buffer(kind):
    def outer_body(c):
        i, buf = c

        def inner_body(d):
            j, b = d
            return j + 1, b.at[2 * i + j].set(10.0 * i + j)

        _, buf = bwi.while_loop(
            lambda d: d[0] < 2, inner_body, (0, buf), buffers=lambda d: d[1],
            kind=kind, max_steps=2,
        )  # fmt: skip
        return i + 1, buf

    def run(scale):
        _, buf = bwi.while_loop(
            lambda c: c[0] < 2, outer_body, (0, jnp.zeros(4) * scale),
            buffers=lambda c: c[1], kind=kind, max_steps=2,
        )  # fmt: skip
        return buf

    assert run(1.0).tolist() == [0.0, 1.0, 10.0, 11.0]
    batched = jax.vmap(run)(jnp.array([1.0, 2.0]))
    assert batched.tolist() == [[0.0, 1.0, 10.0, 11.0]] * 2


def test_select_if_vmap_primitive():
    p = bwi.select_if_vmap_p
    pred = jnp.array([True, False])
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    assert p.bind(pred, x, y).tolist() == [1.0, 4.0]
    assert jax.jit(p.bind)(pred, x, y).tolist() == [1.0, 4.0]
    # batched: the predicate broadcast against the trailing axes of the operands
    out = jax.vmap(p.bind, in_axes=(0, 0, None))(pred, jnp.ones((2, 3)), jnp.zeros(3))
    assert out.tolist() == [[1.0] * 3, [0.0] * 3]
    g = jax.grad(lambda a: p.bind(pred, a, y).sum())(x)
    assert g.tolist() == [1.0, 0.0]


# --- ContainerMeta -----------------------------------------------------------


def test_container_meta_details():
    class Colours(metaclass=bwi.ContainerMeta):
        red = "RED"

        def paint(self):  # methods are members too
            return 1

        __marker__ = "dunder"

    assert Colours.red == 0 and Colours.paint == 1 and Colours.__marker__ == "dunder"
    assert Colours.reverse_lookup[0] == "RED" and len(Colours) == 2
    assert isinstance(np.int32(3), Colours) and isinstance(np.array(2), Colours)
    assert not isinstance(np.array([2]), Colours)
    assert not isinstance(np.bool_(True), Colours)
    assert not isinstance(jax.ShapeDtypeStruct((), jnp.int32), Colours)
    assert not isinstance(1.0, Colours) and isinstance(Colours(), Colours)

    class More(Colours):
        blue = "BLUE"

    assert More.blue == 0 and More[0] == "BLUE" and More.red == 0
    with pytest.raises(ValueError, match="`reverse_lookup` is reserved"):

        class Bad(metaclass=bwi.ContainerMeta):
            reverse_lookup = []


# --- small helpers -----------------------------------------------------------


def test_float_neighbours():
    zero16 = jnp.array(0.0, jnp.float16)
    assert bwi.prevbefore(zero16) == -jnp.finfo(jnp.float16).tiny
    assert bwi.prevbefore(zero16).dtype == jnp.float16
    assert bwi.nextafter(jnp.array(jnp.inf)) == jnp.inf
    assert jax.grad(lambda v: 2 * bwi.prevbefore(v))(3.0) == 2.0
    assert bwi.nextafter.__name__ == "nextafter" and "above" in bwi.nextafter.__doc__
    with pytest.raises(ValueError, match="not inexact"):
        bwi.nextafter(1)


def test_float_neighbours_are_one_cached_operation_inside_a_trace():
    # diffrax steps 100 ULPs down from `t1` per solve: each call is one `jit`
    # operation sharing one traced body, not a fresh trace of the body
    def hundred_below(t):
        for _ in range(100):
            t = bwi.prevbefore(t)
        return t

    closed = jax.make_jaxpr(hundred_below)(jnp.float32(1.0))
    assert [e.primitive.name for e in closed.eqns] == ["jit"] * 100
    assert len({id(e.params["jaxpr"]) for e in closed.eqns}) == 1
    want = np.float32(1.0)
    for _ in range(100):
        want = np.nextafter(want, np.float32(-np.inf))
    assert jax.jit(hundred_below)(jnp.float32(1.0)) == want


def test_scan_trick_under_vmap_and_grad():
    def fn(x):
        return x * x

    assert bwi.scan_trick(fn, [], jnp.array(3.0)) == 9.0
    xs = jnp.array([1.0, 2.0])
    out = jax.vmap(lambda v: bwi.scan_trick(fn, [lambda x: x + v], v))(xs)
    assert out.tolist() == [4.0, 36.0]  # (v*v + v)**2
    # d/dv (v**2 + 1)**2 = 4v(v**2 + 1)
    assert jax.grad(lambda v: bwi.scan_trick(fn, [lambda x: x + 1], v))(1.0) == 8.0


def test_str2jax_types_and_hashable_partition():
    a, b = bwi.str2jax("token"), bwi.str2jax("token")
    assert type(a).__name__ == "token" and type(a) is not type(b)
    assert jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b)
    tree = [1, "s", jnp.ones(1), (2.0, None)]
    dyn, static = bwi.hashable_partition(tree, lambda x: isinstance(x, int))
    assert dyn == (1, None, None, None) and static[0][1:] == ("s", static[0][2], 2.0)
    assert bwi.hashable_combine(dyn, static)[3] == (2.0, None)
    out = bwi.left_broadcast_to(jnp.arange(2), (2, 2, 3))
    assert out.shape == (2, 2, 3) and out[1].tolist() == [[1] * 3] * 2


def test_static_compares_by_leaves():
    value = {"a": [1, "x"]}
    s = bwi.Static(value)
    assert s.value is value and jax.tree_util.tree_leaves(s) == []
    assert s == bwi.Static({"a": [1, "x"]}) and hash(s) == hash(bwi.Static(value))
    assert s != bwi.Static({"a": [2, "x"]})
    assert bw.filter_jit(lambda t: t)(s).value == value


def test_closure_to_pytree_details():
    def make(a, tag):
        def f(x, y=1, *, z=2):
            return a * x + y + z, tag

        return bwi.closure_to_pytree(f)

    f = make(jnp.array(2.0), "t")
    assert f(1.0) == (5.0, "t") and f(1.0, 0, z=0) == (2.0, "t")
    assert f.__wrapped__.__name__ == "f" and "f" in repr(f)
    same = jax.tree_util.tree_structure(make(jnp.array(3.0), "t"))
    assert jax.tree_util.tree_structure(f) == same
    leaves = jax.tree_util.tree_leaves(make(jnp.array(3.0), "u"))
    assert leaves[1] == "u"  # non-array contents are leaves too
    plain = bwi.closure_to_pytree(lambda x: x + 1)
    assert plain(1) == 2 and jax.tree_util.tree_leaves(plain) == []
    assert weakref.ref(f)() is f  # as Equinox's (a Module) is


def test_getkey_seeds_and_sequence(monkeypatch):
    monkeypatch.setenv("BOXWOOD_GETKEY_SEED", "5")
    monkeypatch.setenv("EQX_GETKEY_SEED", "7")
    getkey = bwi.GetKey()
    assert getkey.seed == 5 and repr(getkey) == "GetKey(seed=5, call=0)"
    k = getkey()
    expected = jax.random.fold_in(jax.random.key(5), 1)
    assert (jax.random.key_data(k) == jax.random.key_data(expected)).all()
    assert bwi.GetKey(seed=1).seed == 1


def test_omega_updates_and_errors():
    ω = bwi.ω
    tree = {"v": jnp.arange(3.0)}
    assert ω(tree).at[5].set(9.0, mode="drop").ω["v"].tolist() == [0.0, 1.0, 2.0]
    assert ω(tree).at[1].max(ω({"v": jnp.array(4.0)})).ω["v"][1] == 4.0
    assert (2 ** ω(tree)).ω["v"].tolist() == [1.0, 2.0, 4.0]
    with pytest.raises(AttributeError, match="has no method 'nope'"):
        ω(tree).at[0].nope  # noqa: B018
    with pytest.raises(TypeError, match=r"`ω \.at\[\]\.add \.\.\.` takes another"):
        ω(tree).at[0].add("x")
    with pytest.raises(TypeError, match="unhashable"):
        hash(ω(tree))


def test_doc_repr_in_annotations(monkeypatch):
    def f(a):
        return a

    monkeypatch.setattr(typing, "GENERATING_DOCUMENTATION", "boxwood", raising=False)
    shown = bwi.doc_repr(f, "F")
    assert shown.__name__ == "f" and repr(int | shown) == "typing.Union[int, F]"
    assert repr(shown | None) == "typing.Optional[F]"  # pyright: ignore[reportOperatorIssue]

    def g(x: shown = shown):  # pyright: ignore[reportInvalidTypeForm]
        return x

    assert str(inspect.signature(g)) == "(x: F = F)"


def test_register_impl_finalisation():
    double_p = Primitive("test_internal_misc_double")
    double_p.def_impl(lambda x: x * 2)
    double_p.def_abstract_eval(lambda x: x)
    mlir.register_lowering(double_p, mlir.lower_fun(lambda x: x * 2, False))
    try:
        bwi.register_impl_finalisation(double_p)
        fn = lambda x: jax.lax.cond(x > 0, double_p.bind, lambda v: v, x)  # noqa: E731
        final = bwi.finalise_make_jaxpr(fn)(1.0)
        assert "test_internal_misc_double" not in str(final)
        assert "test_internal_misc_double" in str(jax.make_jaxpr(fn)(1.0))
        assert bwi.finalise_fn(fn)(3.0) == 6.0
        closed = jax.make_jaxpr(fn)(1.0)
        outs = bwi.finalise_eval_jaxpr(closed.jaxpr, closed.consts, jnp.array(-2.0))
        assert outs == [-2.0]
    finally:
        bwi.primitive_finalisations.pop(double_p, None)
