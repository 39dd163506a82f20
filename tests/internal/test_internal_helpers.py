"""boxwood.internal's smaller helpers: loop buffers, scan_trick, eval_*, str2jax,
nextafter, documentation helpers, finalisation, noinline, progress meters."""

import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.internal as bwi


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_while_loop_buffer_set_with_pred(kind):
    def run(scale):
        def cond(c):
            return c[0] < 4

        def body(c):
            i, buf, total = c
            # only even steps write; odd entries keep their initial -1
            buf = buf.at[i].set(scale * i.astype(jnp.float32), pred=(i % 2 == 0))
            return i + 1, buf, total + buf[i]

        init = (0, -jnp.ones(4), jnp.array(0.0))
        return bwi.while_loop(
            cond, body, init, buffers=lambda c: c[1], kind=kind, max_steps=8
        )

    # each a compiled program (eagerly, the loop's surrounding operations and,
    # for the checkpointed kind, its backward pass's compile one by one)
    _, buf, total = jax.jit(run)(1.0)
    assert buf.tolist() == [0.0, -1.0, 2.0, -1.0]
    assert total == 0.0
    if kind != "lax":
        grad = jax.jit(jax.grad(lambda s: run(s)[1].sum()))(1.0)
        assert grad == 2.0  # d/ds (0*s + 2*s)
    batched = jax.jit(jax.vmap(lambda s: run(s)[1]))(jnp.array([1.0, 3.0]))
    assert batched.tolist() == [[0.0, -1.0, 2.0, -1.0], [0.0, -1.0, 6.0, -1.0]]


def test_buffer_types_and_scan_buffers():
    seen = []

    def body(c):
        i, buf = c
        seen.append(isinstance(buf, bwi.MaybeBuffer[jax.Array]))
        seen.append((buf.shape, buf.dtype == jnp.float32))
        return i + 1, bwi.buffer_at_set(buf, i, 5.0, pred=i > 0)

    out = bwi.while_loop(
        lambda c: c[0] < 3, body, (0, jnp.zeros(3)), buffers=lambda c: c[1], kind="lax"
    )
    assert out[1].tolist() == [0.0, 5.0, 5.0]
    assert seen[0] is True and seen[1] == ((3,), True)
    assert not isinstance("text", bwi.MaybeBuffer[jax.Array])
    # a plain array, outside any loop
    assert bwi.buffer_at_set(jnp.zeros(2), 1, 3.0, pred=False).tolist() == [0.0, 0.0]
    assert bwi.buffer_at_set(jnp.zeros(2), 1, 3.0).tolist() == [0.0, 3.0]

    def step(c, x):
        i, buf = c
        return (i + 1, buf.at[i].set(x)), None

    (_, buf), _ = bwi.scan(
        step, (0, jnp.zeros(3)), jnp.arange(3.0), buffers=lambda c: c[1], kind="lax"
    )
    assert buf.tolist() == [0.0, 1.0, 2.0]


def test_buffer_set_errors():
    def body(c):
        return c[0] + 1, c[1].at[0].set(1.0, pred=jnp.array([True, False]))

    with pytest.raises(ValueError, match="`pred` must be a boolean scalar"):
        bwi.while_loop(
            lambda c: c[0] < 1, body, (0, jnp.zeros(2)), buffers=lambda c: c[1],
            kind="lax",
        )  # fmt: skip

    def body2(c):
        return c[0] + 1, c[1].at[0].set(1.5)

    with pytest.raises(ValueError, match="does not fit a buffer of dtype int32"):
        bwi.while_loop(
            lambda c: c[0] < 1, body2, (0, jnp.zeros(2, jnp.int32)),
            buffers=lambda c: c[1], kind="lax",
        )  # fmt: skip


def test_maybe_set_primitive_jvp_and_transpose():
    def f(xs, x):
        return bwi.buffer_at_set(bwi._buffers._Buffer(xs), 1, x, pred=True).array

    xs, x = jnp.arange(3.0), jnp.array(7.0)
    assert f(xs, x).tolist() == [0.0, 7.0, 2.0]
    gxs, gx = jax.grad(
        lambda a, b: (f(a, b) * jnp.array([1.0, 2.0, 3.0])).sum(), (0, 1)
    )(xs, x)
    assert gxs.tolist() == [1.0, 0.0, 3.0] and gx == 2.0
    _, t = jax.jvp(f, (xs, x), (jnp.ones(3), jnp.array(10.0)))
    assert t.tolist() == [1.0, 10.0, 1.0]


def test_scan_trick_and_eval_helpers():
    calls = []

    def fn(x):
        calls.append(1)
        return x * 2

    assert bwi.scan_trick(fn, [lambda x: x + 1, lambda x: x - 3], jnp.array(1.0)) == 6.0
    assert len(calls) == 1  # traced once: ((1*2+1)*2-3)*2
    empty = bwi.eval_empty(lambda a: {"y": a[:2]}, jnp.ones(5))
    assert empty["y"].shape == (2,)
    zero = bwi.eval_zero(lambda a, b: a @ b, jnp.ones((2, 3)), jnp.ones(3))
    assert zero.tolist() == [0.0, 0.0]
    assert bwi.eval_full(lambda: jnp.ones(2), fill_value=4.0).tolist() == [4.0, 4.0]


def test_str2jax_nextafter_broadcast():
    s = bwi.str2jax("solver failed")
    assert str(s) == repr(s) == "solver failed"
    assert jax.tree_util.tree_leaves(s) == []
    assert bw.filter_jit(lambda t, x: (str(t), x))(s, 1.0)[0] == "solver failed"
    x = jnp.array([1.0, 0.0], jnp.float32)
    up, down = bwi.nextafter(x), bwi.prevbefore(x)
    assert (up > x).all() and (down < x).all()
    assert up[1] == jnp.finfo(jnp.float32).tiny
    assert jax.grad(lambda v: bwi.nextafter(v) * 3)(1.0) == 3.0
    assert bwi.left_broadcast_to(jnp.array([1, 2]), (2, 3)).tolist() == [
        [1, 1, 1],
        [2, 2, 2],
    ]


def test_hashable_partition_and_cached_eval_shape():
    tree = {"a": jnp.ones(2), "b": "x", "c": 3}
    dyn, static = bwi.hashable_partition(tree, bw.is_array)
    hash(static)
    back = bwi.hashable_combine(dyn, static)
    assert back["b"] == "x" and back["c"] == 3 and back["a"] is tree["a"]
    traces = []

    def f(x):
        traces.append(1)
        return x + 1

    for _ in range(2):
        out = bwi.cached_filter_eval_shape(f, jnp.ones(3))
    assert out.shape == (3,) and len(traces) == 1
    bwi.cached_filter_eval_shape(f, jnp.ones(4))
    assert len(traces) == 2


def test_container_meta():
    class Colours(metaclass=bwi.ContainerMeta):
        red = "RED"
        blue = "BLUE"

    assert Colours.blue == 1 and Colours[1] == "BLUE" and len(Colours) == 2
    assert isinstance(2, Colours) and isinstance(jnp.array(1), Colours)
    assert not isinstance(jnp.array(1.0), Colours)


def test_doc_helpers(monkeypatch):
    def f(a, hidden=1):
        return a + hidden

    assert bwi.doc_repr(f, "F") is f
    assert bwi.doc_remove_args("hidden")(f) is f
    monkeypatch.setattr(typing, "GENERATING_DOCUMENTATION", "boxwood", raising=False)
    shown = bwi.doc_repr(f, "a function")
    assert repr(shown) == "a function" and shown(1) == 2
    import inspect

    g = bwi.doc_remove_args("hidden")(lambda a, hidden=1: a)
    assert list(inspect.signature(g).parameters) == ["a"]


def test_finalisation_and_noinline():
    calls = []

    def body(x, y):
        calls.append(1)
        return jnp.sin(x) * y

    f = bwi.noinline(body)
    x, y = jnp.array(0.5), jnp.array(3.0)
    np.testing.assert_allclose(f(x, y), jnp.sin(0.5) * 3.0, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(f)(x, y), jnp.sin(0.5) * 3.0, rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(f)(x, y), jnp.cos(0.5) * 3.0, rtol=1e-6
    )  # reverse mode
    out = jax.vmap(f, (0, None))(jnp.array([0.5, 1.0]), y)
    np.testing.assert_allclose(out, jnp.sin(jnp.array([0.5, 1.0])) * 3.0, rtol=1e-6)
    jaxpr = jax.make_jaxpr(f)(x, y)
    assert "boxwood_noinline" in str(jaxpr)
    assert bwi.noinline_p in bwi.primitive_finalisations
    final = bwi.finalise_make_jaxpr(f)(x, y)
    assert "boxwood_noinline" not in str(final) and "sin" in str(final)
    np.testing.assert_allclose(bwi.finalise_fn(f)(x, y), jnp.sin(0.5) * 3.0, rtol=1e-6)
    # nested jaxprs (a cond's branches) are finalised too
    g = lambda x: jax.lax.cond(x > 0, lambda v: f(v, y), lambda v: v, x)  # noqa: E731
    assert "boxwood_noinline" not in str(bwi.finalise_make_jaxpr(g)(x))
    closed, shape = bwi.finalise_make_jaxpr(g, return_shape=True)(x)
    assert shape.shape == ()
    assert bwi.finalise_jaxpr_as_fn(closed)(x)[0] == g(x)


def test_progress_meters(capfd):
    meter = bwi.TextProgressMeter(minimum_increase=0.3)

    @jax.jit
    def solve():
        state = meter.init()
        for p in (0.1, 0.5, 0.6, 1.0):
            state = meter.step(state, jnp.array(p))
        meter.close(state)
        return state.progress

    assert solve() == 1.0
    jax.effects_barrier()
    assert capfd.readouterr().out.split() == ["0.00%", "50.00%", "100.00%"]
    none = bwi.NoProgressMeter()
    assert none.step(none.init(), 0.5) is None
    with pytest.raises(TypeError, match="abstract"):
        bwi.AbstractProgressMeter()


def test_optional_bridges():
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        with pytest.raises(ImportError, match="needs `tensorflow` and `tf2onnx`"):
            bwi.to_onnx(lambda x: x)(jnp.ones(2))
    import wadler_lindig as wl

    custom = bwi.TreeWLCustom(lambda n: n == "cut", True, True)
    text = wl.pformat({"a": jnp.ones((2, 3)), "b": "cut"}, custom=custom)
    assert "f32[2,3]" in text and "str(...)" in text
    assert custom(1) is None


def test_assert_dce():
    x = jnp.ones(2)
    assert bwi.assert_dce(x, "kept") is x  # outside jit: nothing is checked

    @jax.jit
    def used(v):
        return bwi.assert_dce(v, "value was not removed") + 1

    with pytest.raises(Exception, match="value was not removed"):
        jax.block_until_ready(used(x))

    @jax.jit
    def removed(v):
        bwi.assert_dce(v * 2, "value was not removed")
        return v + 1

    assert removed(x).tolist() == [2.0, 2.0]


def test_nested_loops_share_a_buffer():
    # The inner loop selects the outer loop's buffer again (as diffrax's nested
    # loops do); writes go through both.
    def outer_body(c):
        i, buf = c

        def inner_body(d):
            j, b = d
            return j + 1, b.at[2 * i + j].set((10 * i + j).astype(jnp.float32))

        _, buf = bwi.while_loop(
            lambda d: d[0] < 2, inner_body, (0, buf), buffers=lambda d: d[1],
            kind="lax",
        )  # fmt: skip
        assert isinstance(buf, bwi.MaybeBuffer[jax.Array])
        return i + 1, buf

    _, buf = bwi.while_loop(
        lambda c: c[0] < 2, outer_body, (0, jnp.zeros(4)), buffers=lambda c: c[1],
        kind="checkpointed", max_steps=2,
    )  # fmt: skip
    assert buf.tolist() == [0.0, 1.0, 10.0, 11.0]


def test_cached_filter_eval_shape_keeps_weak_types():
    # diffrax's `direction = jnp.where(t0 < t1, 1, -1)` is weakly typed, and its
    # `t * direction` must trace under strict promotion
    direction = jnp.where(jnp.array(True), 1, -1)
    fn = lambda t, d: t * d  # noqa: E731
    with jax.numpy_dtype_promotion("strict"):
        out = bw.internal.cached_filter_eval_shape(fn, jnp.array(2.0), direction)
    assert out.shape == () and out.dtype == jnp.float32
    strong = jnp.asarray(1, dtype=jnp.int32)
    with (
        jax.numpy_dtype_promotion("strict"),
        pytest.raises(jax.dtypes.TypePromotionError, match="int32"),
    ):
        bw.internal.cached_filter_eval_shape(fn, jnp.array(2.0), strong)
