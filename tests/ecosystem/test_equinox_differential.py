"""The same inputs through boxwood and the installed Equinox: the core functions that
both libraries define must agree (values, structure, which inputs raise)."""

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.internal as bwi

TREE = {
    "w": jnp.array([[1.0, 2.0], [3.0, 4.0]]),
    "b": np.array([0.5, -0.5], np.float32),
    "n": jnp.array([1, 2]),
    "act": "relu",
    "scale": 2.0,
    "count": 3,
    "none": None,
    "nested": ([jnp.array(1.5)], ()),
}


def same(a, b):
    """Equal structure and equal leaves (arrays by value, shape and dtype)."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        if bw.is_array(x) or bw.is_array(y):
            assert type(x) is type(y)
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
        else:
            assert x == y and type(x) is type(y)


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the kind of failure is compared
        return "raised", type(e)


@pytest.mark.parametrize(
    "name", ["is_array", "is_array_like", "is_inexact_array", "is_inexact_array_like"]
)
def test_filters(name):
    for spec in (getattr(eqx, name), getattr(bw, name)):
        assert callable(spec)
    same(eqx.filter(TREE, getattr(eqx, name)), bw.filter(TREE, getattr(bw, name)))
    same(eqx.partition(TREE, getattr(eqx, name)), bw.partition(TREE, getattr(bw, name)))
    a, b = bw.partition(TREE, getattr(bw, name))
    same(eqx.combine(*eqx.partition(TREE, getattr(eqx, name))), bw.combine(a, b))


TREE_AT_CASES = [
    (lambda t: t["w"], {"replace": jnp.zeros(3)}),
    (lambda t: t["none"], {"replace": 5}),
    (lambda t: t["nested"][1], {"replace": (1, 2)}),
    (lambda t: t["nested"], {"replace_fn": lambda x: len(x)}),
    (lambda t: (t["act"], t["count"]), {"replace": ("gelu", 4)}),
    (lambda t: [t["scale"], t["w"]], {"replace_fn": lambda x: x * 2}),
    (lambda t: t["nested"][0], {"replace": {"a": [1, 2]}}),
    (lambda t: t, {"replace": 1}),
    (lambda t: 5, {"replace": 1}),  # not a node: both raise
    (lambda t: (t["act"], t["count"]), {"replace": (1,)}),  # wrong length: both raise
]


@pytest.mark.parametrize("case", range(len(TREE_AT_CASES)))
def test_tree_at(case):
    where, kwargs = TREE_AT_CASES[case]
    kind_e, out_e = outcome(lambda: eqx.tree_at(where, TREE, **kwargs))
    kind_b, out_b = outcome(lambda: bw.tree_at(where, TREE, **kwargs))
    assert kind_e == kind_b
    if kind_e == "ok":
        same(out_e, out_b)


TREE_EQUAL_CASES = [
    ((TREE, TREE), {}),
    ((jnp.ones(3), jnp.ones(3) + 1e-7), {}),
    ((jnp.ones(3), jnp.ones(3) + 1e-7), {"rtol": 1e-5, "atol": 1e-5}),
    ((jnp.ones(3), jnp.ones(3) + 1e-2), {"rtol": 1e-5, "atol": 1e-5}),
    ((np.ones(3), np.ones(3)), {}),
    ((np.ones(3), jnp.ones(3)), {}),
    ((jnp.ones(3), jnp.ones(4)), {}),
    ((jnp.ones(3), jnp.ones(3, jnp.int32)), {}),
    ((1, 1.0), {}),
    ((1, 1.0), {"typematch": True}),
    (([1], (1,)), {}),
    ((jnp.array([jnp.nan]), jnp.array([jnp.nan])), {}),
    ((TREE, TREE, TREE), {}),
]


@pytest.mark.parametrize("case", range(len(TREE_EQUAL_CASES)))
def test_tree_equal(case):
    trees, kwargs = TREE_EQUAL_CASES[case]
    assert bool(eqx.tree_equal(*trees, **kwargs)) == bool(
        bw.tree_equal(*trees, **kwargs)
    )


def test_tree_equal_under_jit_is_a_traced_bool_in_both():
    for lib in (eqx, bw):
        out = jax.jit(lambda a, b, lib=lib: lib.tree_equal(a, b))(
            jnp.ones(2), jnp.ones(2)
        )
        assert out.dtype == jnp.bool_ and bool(out)
        out = jax.jit(lambda a, lib=lib: lib.tree_equal(a, a + 1, atol=1e-3))(
            jnp.ones(2)
        )
        assert not bool(out)


def test_grad_value_and_grad_jacobians_hessian():
    def loss(t, x):
        return jnp.sum(jnp.tanh(t["w"] @ x + t["b"]) * t["scale"]) + t["nested"][0][0]

    x = jnp.array([0.3, -0.2])
    same(eqx.filter_grad(loss)(TREE, x), bw.filter_grad(loss)(TREE, x))
    same(
        eqx.filter_value_and_grad(loss)(TREE, x),
        bw.filter_value_and_grad(loss)(TREE, x),
    )
    aux_loss = lambda t, x: (loss(t, x), {"tag": "a"})  # noqa: E731
    same(
        eqx.filter_grad(aux_loss, has_aux=True)(TREE, x),
        bw.filter_grad(aux_loss, has_aux=True)(TREE, x),
    )
    vec = lambda t, x: jnp.tanh(t["w"] @ x) * t["scale"]  # noqa: E731
    same(eqx.filter_jacfwd(vec)(TREE, x), bw.filter_jacfwd(vec)(TREE, x))
    same(eqx.filter_jacrev(vec)(TREE, x), bw.filter_jacrev(vec)(TREE, x))
    same(eqx.filter_hessian(loss)(TREE, x), bw.filter_hessian(loss)(TREE, x))


def test_jvp_and_vjp():
    def f(t, x):
        return {"y": t["w"] @ x * t["scale"], "n": t["n"] * 2, "act": t["act"]}

    x = jnp.array([0.3, -0.2])
    tangents = (jax.tree_util.tree_map(lambda _: None, TREE), jnp.array([1.0, 0.0]))
    tangents[0]["w"] = jnp.ones((2, 2))
    same(eqx.filter_jvp(f, (TREE, x), tangents), bw.filter_jvp(f, (TREE, x), tangents))
    out_e, vjp_e = eqx.filter_vjp(f, TREE, x)
    out_b, vjp_b = bw.filter_vjp(f, TREE, x)
    same(out_e, out_b)
    ct = {"y": jnp.array([1.0, 2.0]), "n": None, "act": None}
    same(vjp_e(ct), vjp_b(ct))


def test_filter_vmap():
    def f(t, x):
        return {"y": t["w"] @ x, "act": t["act"], "count": t["count"]}

    xs = jnp.arange(6.0).reshape(3, 2)
    same(
        eqx.filter_vmap(f, in_axes=(None, 0))(TREE, xs),
        bw.filter_vmap(f, in_axes=(None, 0))(TREE, xs),
    )


def test_tree_flatten_one_level_and_tree_check():
    for node in (TREE, TREE["nested"], 4, None, ()):
        le, te = eqx.tree_flatten_one_level(node)
        lb, tb = bw.tree_flatten_one_level(node)
        assert te == tb and len(le) == len(lb)
    shared = [1]
    for tree in ([shared, shared], [[1], [1]], [(), ()], {"a": TREE, "b": TREE}):
        assert (
            outcome(lambda t=tree: eqx.tree_check(t))[0]
            == outcome(lambda t=tree: bw.tree_check(t))[0]
        )


def test_error_if_raises_for_the_same_inputs():
    for pred in (jnp.array([False, False]), jnp.array([False, True])):
        fe = eqx.filter_jit(lambda x, p: eqx.error_if(x, p, "boom"))
        fb = bw.filter_jit(lambda x, p: bw.error_if(x, p, "boom"))
        kind_e, _ = outcome(
            lambda f=fe, p=pred: jax.block_until_ready(f(jnp.ones(2), p))
        )
        kind_b, _ = outcome(
            lambda f=fb, p=pred: jax.block_until_ready(f(jnp.ones(2), p))
        )
        assert kind_e == kind_b


@pytest.mark.parametrize("kind", ["lax", "bounded", "checkpointed"])
def test_while_loop_values_and_gradients(kind):
    def run(lib, w):
        def body(c):
            i, y = c
            return i + 1, jnp.sin(w * y) + y

        out = lib.while_loop(lambda c: c[0] < 6, body, (0, jnp.array([0.5, 1.0])),
                             kind=kind, max_steps=8)  # fmt: skip
        return jnp.sum(out[1])

    assert jnp.allclose(run(eqxi, 0.7), run(bwi, 0.7))
    if kind != "lax":
        ge = jax.grad(lambda w: run(eqxi, w))(0.7)
        gb = jax.grad(lambda w: run(bwi, w))(0.7)
        assert jnp.allclose(ge, gb, rtol=1e-5)


def test_scan_and_omega_and_unvmap():
    step = lambda c, x: (c * 0.5 + x, c)  # noqa: E731
    xs = jnp.arange(5.0)
    for kind in ("lax", "checkpointed"):
        same(eqxi.scan(step, jnp.zeros(()), xs, kind=kind),
             bwi.scan(step, jnp.zeros(()), xs, kind=kind))  # fmt: skip
    a = {"x": jnp.array(1.0), "y": jnp.array([2.0])}
    same((a**eqxi.ω * 2 - a**eqxi.ω).ω, (a**bwi.ω * 2 - a**bwi.ω).ω)
    bools = jnp.array([False, True, False])
    for name in ("unvmap_any", "unvmap_all", "unvmap_max"):
        x = bools if name != "unvmap_max" else jnp.array([1, 5, 2])
        same(jax.vmap(getattr(eqxi, name))(x), jax.vmap(getattr(bwi, name))(x))


def test_enumeration_behaves_alike():
    class E(eqx.Enumeration):
        a = "first"
        b = "second"

    class B(bw.Enumeration):
        a = "first"
        b = "second"

    assert len(E) == len(B) and E[E.b] == B[B.b]
    assert bool(E.a == E.b) == bool(B.a == B.b)
    assert int(E.where(jnp.array(False), E.a, E.b)._value) == int(
        B.where(jnp.array(False), B.a, B.b)._value
    )
