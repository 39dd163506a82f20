"""boxwood.internal's custom-primitive helpers, used as lineax uses them: a linear
solve primitive over pytrees, with JVP, transpose and (derived) batching rules."""

import functools as ft

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import ad, batching

import boxwood as bw
import boxwood.internal as bwi


def test_names_follow_equinox_internal():
    public = {n for n in dir(eqxi) if not n.startswith("_")}
    missing = public - set(dir(bwi))
    assert not missing, sorted(missing)
    assert "no stability guarantee" in bwi.__doc__


class Op(bw.Module):
    """A matrix with a static tag, as lineax's operators carry structure."""

    matrix: jax.Array
    tag: str = bw.field(static=True)


def _solve(op, b, scale):
    # `scale` is a non-array leaf: it rides along as a parameter.
    return {"x": jnp.linalg.solve(op.matrix, b) * scale, "note": op.tag}


@bwi.filter_primitive_def
def _abstract(op, b, scale):
    assert isinstance(b, jax.core.ShapedArray)
    return {"x": b, "note": op.tag}


@bwi.filter_primitive_jvp
def _jvp(primals, tangents):
    op, b, scale = primals
    t_op, t_b, t_scale = tangents
    assert t_scale is None
    out = bwi.filter_primitive_bind(solve_p, op, b, scale)
    # d(A^-1 b) = A^-1 (db - dA A^-1 b)
    rhs = bwi.materialise_zeros(b, t_b)
    if t_op is not None and t_op.matrix is not None:
        rhs = rhs - t_op.matrix @ (out["x"] / scale)
    t_x = bwi.filter_primitive_bind(solve_p, op, rhs, scale)["x"]
    return out, {"x": t_x, "note": None}


@bwi.filter_primitive_transpose(materialise_zeros=True)
def _transpose(inputs, cts_out):
    op, b, scale = inputs
    assert isinstance(b, ad.UndefinedPrimal)
    assert not isinstance(op.matrix, ad.UndefinedPrimal)
    transposed = Op(op.matrix.T, op.tag)
    ct_b = bwi.filter_primitive_bind(solve_p, transposed, cts_out["x"], scale)["x"]
    return jax.tree_util.tree_map(lambda _: None, op), ct_b, None


solve_p = bwi.create_vprim(
    "test_solve", bwi.filter_primitive_def(_solve), _abstract, _jvp, _transpose
)


def solve(matrix, b, scale=2.0):
    return bwi.filter_primitive_bind(solve_p, Op(matrix, "t"), b, scale)["x"]


def reference(matrix, b, scale=2.0):
    return jnp.linalg.solve(matrix, b) * scale


def compiled(fn, *args):
    """`fn(*args)` as one compiled program: for the references in plain
    `jax.numpy`, which eagerly would compile operation by operation (the
    primitive under test runs eagerly, as written)."""
    return jax.jit(fn)(*args)


A = jnp.array([[3.0, 1.0], [1.0, 2.0]])
B = jnp.array([1.0, -1.0])


def test_bind_keeps_static_outputs():
    out = bwi.filter_primitive_bind(solve_p, Op(A, "tag!"), B, 1.0)
    assert out["note"] == "tag!"
    np.testing.assert_allclose(out["x"], jnp.linalg.solve(A, B), rtol=1e-6)
    out = bw.filter_jit(
        lambda a, b: bwi.filter_primitive_bind(solve_p, Op(a, "j"), b, 1.0)
    )(A, B)
    assert out["note"] == "j"


def test_jvp_and_grad():
    for argnums in (0, 1):
        got = jax.jacfwd(solve, argnums)(A, B)
        want = compiled(jax.jacfwd(reference, argnums), A, B)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # Reverse mode in `b` goes through the transpose rule.
    got = jax.grad(lambda b: solve(A, b).sum())(B)
    want = compiled(jax.grad(lambda b: reference(A, b).sum()), B)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    lin = jax.linear_transpose(lambda b: solve(A, b), B)
    np.testing.assert_allclose(lin(jnp.ones(2))[0], want, rtol=1e-5)


@ft.partial(jax.jit, static_argnums=0)
def _with_solve_and_reference(case):
    """`case(solve)` and `case(reference)` in one compiled program (eagerly, each
    operation of the rules and of the reference would compile on its own)."""
    return case(solve), case(reference)


def test_derived_batching():
    bs = jnp.stack([B, 2 * B, -B])
    As = jnp.stack([A, A + jnp.eye(2), 2 * A])
    # eagerly, as written: the batched primitive dispatched on its own
    np.testing.assert_allclose(
        jax.vmap(solve, (None, 0))(A, bs), compiled(reference, A, bs.T).T, rtol=1e-5
    )
    cases = [
        lambda fn: jax.vmap(fn)(As, bs),
        # vmap inside vmap, vmap of grad, grad of vmap, jvp of vmap
        lambda fn: jax.vmap(jax.vmap(fn, (None, 0)), (0, None))(As, bs),
        lambda fn: jax.vmap(jax.grad(lambda b: fn(A, b).sum()))(bs),
        lambda fn: jax.grad(lambda b: jax.vmap(fn)(As, jnp.stack([b] * 3)).sum())(B),
        lambda fn: jax.jvp(lambda m: jax.vmap(fn)(m, bs), (As,), (jnp.ones_like(As),))[
            1
        ],
        # unbatched operands of a batched call: the cotangent is summed over the batch
        lambda fn: jax.grad(lambda b: jax.vmap(fn, (0, None))(As, b).sum())(B),
    ]
    for case in cases:
        got, want = _with_solve_and_reference(case)
        assert got.shape == want.shape
        rtol = 1e-4 if case is cases[4] else 1e-5  # the jvp's tolerance as before
        np.testing.assert_allclose(got, want, rtol=rtol)
    nested = _with_solve_and_reference(cases[1])[0]
    assert nested.shape == (3, 3, 2)
    want = compiled(lambda a, b: reference(a[1], b[2]), As, bs)
    np.testing.assert_allclose(nested[1, 2], want, rtol=1e-5)


def test_filter_primitive_batching_rule():
    from jax.extend.core import Primitive

    calls = []
    prim = Primitive("test_scale_tree")
    prim.multiple_results = True

    def impl(tree, factor):
        return {"y": tree["a"] * factor, "name": "out"}

    def batch(inputs, axes):
        tree, factor = inputs
        assert axes[1] is None and axes[0]["b"] is None
        calls.append(axes[0]["a"])
        return impl(tree, factor), {"y": axes[0]["a"], "name": None}

    prim.def_impl(bwi.filter_primitive_def(impl))
    prim.def_abstract_eval(
        bwi.filter_primitive_def(lambda tree, f: {"y": tree["a"], "name": "out"})
    )
    batching.primitive_batchers[prim] = bwi.filter_primitive_batching(batch)

    names = []

    def f(a):
        out = bwi.filter_primitive_bind(prim, {"a": a, "b": jnp.ones(())}, 3.0)
        names.append(out["name"])
        return out["y"]

    out = jax.vmap(f, in_axes=1, out_axes=1)(jnp.ones((2, 4)))
    assert names == ["out"] and calls == [1]
    np.testing.assert_array_equal(out, jnp.full((2, 4), 3.0))


def test_bind_needs_multiple_results():
    from jax.extend.core import Primitive

    with pytest.raises(ValueError, match="multiple_results = True"):
        bwi.filter_primitive_bind(Primitive("single"), jnp.ones(()))


def test_materialise_zeros():
    z = bwi.materialise_zeros(jnp.ones((2,), jnp.float32), None)
    assert z.shape == (2,) and not z.any()
    s = bwi.materialise_zeros(jax.ShapeDtypeStruct((3,), jnp.float32), None, True)
    assert s.shape == (3,)
    assert bwi.materialise_zeros(jax.ShapeDtypeStruct((3,), jnp.float32), None) is None
    assert bwi.materialise_zeros("static", None) is None
    t = jnp.ones(2)
    assert bwi.materialise_zeros(jnp.ones(2), t) is t


def test_nontraceable_and_nonbatchable():
    x = {"a": jnp.ones(2), "s": "static"}
    assert bwi.nontraceable(x)["s"] == "static"
    with pytest.raises(RuntimeError, match="Detected differentiation of my op"):
        jax.grad(lambda v: bwi.nontraceable(v, name="my op").sum())(jnp.ones(2))
    with pytest.raises(RuntimeError, match="Detected batching of my op"):
        jax.vmap(lambda v: bwi.nontraceable(v, name="my op"))(jnp.ones(2))
    with pytest.raises(ValueError, match="Unexpected batch tracer. stepper cannot"):
        jax.vmap(lambda v: bwi.nonbatchable(v, name="stepper"))(jnp.ones(2))
    f = jax.vmap(
        lambda v: bwi.nonbatchable(v, allow_constant_across_batch=True), out_axes=None
    )
    assert f(jnp.array([2.0, 2.0])) == 2.0
    with pytest.raises(Exception, match="Nonconstant batch"):
        jax.block_until_ready(f(jnp.array([1.0, 2.0])))
    # unbatched values pass, and forward-mode differentiation goes through
    assert jax.vmap(lambda v: v + bwi.nonbatchable(jnp.ones(())))(jnp.ones(2)).shape
    assert jax.grad(lambda v: bwi.nonbatchable(v) * 2)(1.0) == 2.0


def test_unvmap_primitives_and_select():
    x = jnp.array([False, True])
    assert jax.vmap(bwi.unvmap_any_p.bind)(x).tolist() == [True, True]
    assert jax.vmap(bwi.unvmap_all_p.bind)(x).tolist() == [False, False]
    assert jax.vmap(bwi.unvmap_max_p.bind)(jnp.array([1, 5])).tolist() == [5, 5]
    assert bwi.unvmap_max_p.bind(jnp.array([1, 5])) == 5
    pred = jnp.array([True, False])
    out = jax.vmap(bwi.select_if_vmap_p.bind)(pred, jnp.ones(2), jnp.zeros(2))
    assert out.tolist() == [1.0, 0.0]
    g = jax.grad(lambda x: bwi.select_if_vmap_p.bind(True, x, 0.0 * x))(3.0)
    assert g == 1.0


def _tree_prim(name, impl, abstract=None, jvp=None, transpose=None, batch=None):
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(bwi.filter_primitive_def(impl))
    prim.def_abstract_eval(bwi.filter_primitive_def(abstract or impl))
    mlir.register_lowering(
        prim, mlir.lower_fun(bwi.filter_primitive_def(impl), multiple_results=True)
    )
    if jvp is not None:
        ad.primitive_jvps[prim] = bwi.filter_primitive_jvp(jvp)
    if transpose is not None:
        ad.primitive_transposes[prim] = bwi.filter_primitive_transpose(transpose)
    if batch is not None:
        batching.primitive_batchers[prim] = bwi.filter_primitive_batching(batch)
    return prim


def test_filter_primitive_rules_must_agree_on_the_output():
    prim = _tree_prim(
        "test_disagree",
        lambda x: {"a": x, "b": x},
        abstract=lambda x: {"a": x},
    )
    assert bwi.filter_primitive_bind(prim, jnp.ones(2))["b"].shape == (2,)
    with pytest.raises(ValueError, match="returned outputs of different structures"):
        jax.jit(lambda x: bwi.filter_primitive_bind(prim, x))(jnp.ones(2))


def test_filter_primitive_companion_trees_are_checked():
    def jvp_none_output(primals, tangents):
        (x,), (t,) = primals, tangents
        return (x, None, 2 * x), (t, t, None)  # a tangent where the output is None

    def jvp_missing_tangent(primals, tangents):
        (x,), (t,) = primals, tangents
        return (x, None, 2 * x), (t,)

    for jvp, match in (
        (jvp_none_output, r"a tangent at `\[1\]`, which holds no array"),
        (jvp_missing_tangent, r"does not match its arrays: nothing found for `\[2\]`"),
    ):
        prim = _tree_prim("test_companion", lambda x: (x, None, 2 * x), jvp=jvp)
        with pytest.raises(ValueError, match=match):
            jax.jvp(ft.partial(bwi.filter_primitive_bind, prim), (1.0,), (1.0,))


def test_filter_primitive_transpose_cotangent_for_a_static_input():
    def jvp(primals, tangents):
        x, scale = primals
        t = bwi.filter_primitive_bind(prim, tangents[0], scale)
        return bwi.filter_primitive_bind(prim, x, scale), t

    def transpose(inputs, ct):
        return ct, 1.0  # `scale` is not an array: it cannot have a cotangent

    prim = _tree_prim(
        "test_static_ct", lambda x, scale: x, jvp=jvp, transpose=transpose
    )
    with pytest.raises(ValueError, match=r"a cotangent at `\[1\]`, which holds no"):
        jax.grad(lambda x: bwi.filter_primitive_bind(prim, x, 2.0))(1.0)


def test_filter_primitive_transpose_sees_none_for_symbolic_zeros():
    seen = []

    def jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return bwi.filter_primitive_bind(prim, x), bwi.filter_primitive_bind(prim, t)

    def transpose(inputs, cts):
        seen.append(tuple(c is None for c in cts))
        (x,) = inputs
        assert isinstance(x, ad.UndefinedPrimal)
        a, b = (jnp.zeros(()) if c is None else c for c in cts)
        return (a + 2 * b,)

    prim = _tree_prim(
        "test_zero_ct",
        lambda x: (x, 2 * x),
        abstract=lambda x: (x, x),
        jvp=jvp,
        transpose=transpose,
    )
    g = jax.grad(lambda x: bwi.filter_primitive_bind(prim, x)[1])(1.0)
    assert g == 2.0 and seen == [(True, False)]


def test_filter_primitive_jvp_python_scalar_output_with_tangent():
    # A static (Python float) output given a tangent becomes an operand.
    def jvp(primals, tangents):
        _, (t,) = primals, tangents
        return 3.0, t * 3.0

    prim = _tree_prim("test_scalar_out", lambda x: 3.0 * x, jvp=jvp)
    out, t = jax.jvp(lambda x: bwi.filter_primitive_bind(prim, x), (1.0,), (2.0,))
    assert out == 3.0 and t == 6.0


# A `create_vprim` primitive with two operands, `a` (never linear) and `x`:
# outputs `k * a * x` and `sum(x)`, checked against the same in plain jax.numpy.
def _v_impl(a, x, *, k):
    return [k * a * x, jnp.sum(x, keepdims=True)]


def _v_abstract(a, x, *, k):
    return [x, jax.core.ShapedArray((1,), x.dtype)]


def _v_jvp(primals, tangents, *, k):
    (a, x), (ta, tx) = primals, map(ad.instantiate_zeros, tangents)
    return _v_p.bind(a, x, k=k), [k * (ta * x + a * tx), jnp.sum(tx, keepdims=True)]


def _v_transpose(cts, a, x, *, k):
    assert isinstance(x, ad.UndefinedPrimal) and not isinstance(a, ad.UndefinedPrimal)
    c0, c1 = map(ad.instantiate_zeros, cts)
    return [None, k * a * c0 + c1]


_v_p = bwi.create_vprim("test_two_out", _v_impl, _v_abstract, _v_jvp, _v_transpose)


def _v(a, x):
    return tuple(_v_p.bind(a, x, k=2.0))


def _v_ref(a, x):
    return tuple(_v_impl(a, x, k=2.0))


VA = jnp.arange(1.0, 4.0)
VX = jnp.arange(6.0).reshape(2, 3) + 1


def _close(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        if not isinstance(g, jax.ShapeDtypeStruct):
            np.testing.assert_allclose(g, w, rtol=1e-5)


def test_vprim_batching_along_any_axis_and_nested():
    As = jnp.stack([VA, 2 * VA, VA, 3 * VA])
    Xs = jnp.stack([VX.T] * 4, -1)  # (3, 2, 4)
    for f in (
        lambda fn: jax.vmap(fn, (None, 1))(VA, VX.T),
        lambda fn: jax.vmap(jax.vmap(fn, (None, 1)), (0, 2))(As, Xs),
        lambda fn: jax.jit(jax.vmap(jax.vmap(fn, (0, None)), (None, 0)))(As, VX),
        lambda fn: jax.eval_shape(
            jax.vmap(fn, (0, 1)), As[:3], VX.T[:, :1].repeat(3, 1)
        ),
    ):
        _close(f(_v), f(_v_ref))


def test_vprim_differentiated_inside_and_outside_vmap():
    ones = (jnp.ones(3), jnp.ones((2, 3)))
    sums = lambda fn: lambda *args: sum(o.sum() for o in fn(*args))  # noqa: E731
    As = jnp.stack([VA, 2 * VA])
    cases = [
        lambda fn: jax.jvp(jax.vmap(fn, (None, 0)), (VA, VX), ones),
        lambda fn: jax.jvp(lambda x: jax.vmap(fn, (None, 0))(VA, x), (VX,), ones[1:]),
        lambda fn: jax.vmap(lambda x: jax.jvp(lambda y: fn(VA, y), (x,), (x,)))(VX),
        lambda fn: jax.grad(lambda x: sums(jax.vmap(fn, (None, 0)))(VA, x))(VX),
        # `x` unbatched inside a batched call: its cotangent is summed over the batch
        lambda fn: jax.grad(lambda x: sums(jax.vmap(fn, (0, None)))(As, x))(VA),
        lambda fn: jax.grad(
            lambda x: sums(jax.vmap(jax.vmap(fn, (0, None)), (0, None)))(
                jnp.stack([As] * 2), x
            )
        )(VA),
        lambda fn: jax.vmap(jax.grad(lambda x: sums(fn)(VA, x)))(VX),
        lambda fn: jax.grad(lambda x: jax.vmap(fn, (None, 0))(VA, x)[0].sum())(VX),
    ]
    # the first case eagerly, as written (the rules' results dispatched op by op);
    # the others with the reference in one program each (eagerly, every operation
    # of the rules would compile on its own)
    _close(cases[0](_v), jax.jit(cases[0], static_argnums=0)(_v_ref))
    for f in cases[1:]:
        _close(*_side_by_side(f))


@ft.partial(jax.jit, static_argnums=0)
def _side_by_side(f):
    """`f` of the primitive and of its reference, in one compiled program."""
    return f(_v), f(_v_ref)


def test_vprim_keeps_the_vmap_axis_name():
    p = bwi.create_vprim(
        "test_psum", lambda x: [jax.lax.psum(x, "i")], lambda x: [x], None, None
    )
    out = jax.vmap(lambda x: p.bind(x)[0], axis_name="i")(jnp.arange(3.0))
    assert out.tolist() == [3.0, 3.0, 3.0]


def test_nondifferentiable_backward_details():
    nb = bwi.nondifferentiable_backward
    # eager forward mode keeps Python scalars as they are
    primal, tangent = jax.jvp(nb, (1.0,), (2.0,))
    assert type(primal) is float and type(tangent) is float and tangent == 2.0
    tree = (jnp.arange(3), 2.0, "s")
    out = nb(tree)
    assert out[1:] == (2.0, "s") and out[0] is tree[0]
    # integer leaves never get a cotangent; a leaf that is not differentiated is fine
    g = jax.grad(lambda x, i: x * nb(i), allow_int=True)(2.0, 3)
    assert g == 3.0
    assert jax.grad(lambda x, y: nb((x, y))[1] + x)(2.0, 3.0) == 1.0
    assert jax.jacfwd(jax.jacfwd(lambda x: nb(x) ** 3))(2.0) == 12.0
    with pytest.raises(RuntimeError, match="cannot be differentiated in reverse"):
        jax.vmap(jax.grad(lambda x: nb(x) ** 2))(jnp.ones(2))
    # a cotangent of zeros: refused when traced, accepted when checked at run time
    with pytest.raises(RuntimeError, match="Unexpected cotangent"):
        jax.grad(lambda x: 0.0 * nb(x) + x)(2.0)
    g = jax.jit(jax.grad(lambda x: 0.0 * nb(x, symbolic=False) + x))(2.0)
    assert g == 1.0


def test_nondifferentiable_refuses_any_differentiated_leaf():
    nd = bwi.nondifferentiable
    assert jax.grad(lambda x: x * nd(jnp.array(3.0)))(2.0) == 3.0
    with pytest.raises(RuntimeError, match="This operation cannot be differentiated"):
        jax.grad(lambda x, y: sum(nd((x, y))))(2.0, 3.0)
    assert nd((jnp.arange(2), "s"))[1] == "s"


def test_nonbatchable_details():
    nbt = bwi.nonbatchable
    const = lambda **kw: lambda v: nbt(v, allow_constant_across_batch=True, **kw)  # noqa: E731
    out = jax.vmap(const(), in_axes=1, out_axes=None)(jnp.ones((2, 3)))
    assert out.tolist() == [1.0, 1.0]
    flag = jax.vmap(const(), out_axes=None)(jnp.array([True, True]))
    assert flag.dtype == jnp.bool_ and bool(flag)
    mixed = jax.vmap(const(), in_axes=((0, None),), out_axes=None)((jnp.ones(3), 2.0))
    assert mixed[0] == 1.0 and mixed[1] == 2.0
    with pytest.raises(Exception, match="Nonconstant batch. op was given"):
        jax.block_until_ready(
            jax.vmap(const(name="op"), out_axes=None)(jnp.full(3, jnp.nan))
        )
    with pytest.raises(ValueError, match="^custom!"):
        jax.vmap(lambda v: nbt(v, msg="custom!"))(jnp.ones(2))
    # forward mode under vmap: only the tangent is batched, which is allowed
    _, t = jax.vmap(lambda t: jax.jvp(lambda x: nbt(x) * 2, (1.0,), (t,)))(
        jnp.arange(3.0)
    )
    assert t.tolist() == [0.0, 2.0, 4.0]


def test_announce_transform_sequences():
    def seen_by(run, **kw):
        seen = []
        run(lambda x: bw.debug.announce_transform(x, announce=seen.append, **kw))
        return seen

    assert seen_by(lambda f: f(1.0)) == ["impl"]
    assert seen_by(lambda f: jax.jvp(f, (1.0,), (1.0,))) == ["jvp:impl"] * 2
    assert seen_by(lambda f: jax.grad(lambda x: f(x) ** 2)(1.0)) == [
        "jvp:impl", "jvp:abstract", "jvp:abstract", "jvp:transpose:impl",
    ]  # fmt: skip
    assert seen_by(lambda f: jax.jit(jax.grad(lambda x: f(x) ** 2))(1.0)) == [
        "jvp:abstract", "jvp:abstract", "jvp:abstract", "jvp:transpose:abstract",
        "jvp:mlir", "jvp:transpose:mlir",
    ]  # fmt: skip
    vmapped = seen_by(
        lambda f: jax.vmap(jax.grad(lambda x: f(x) ** 2))(jnp.ones(2)),
        intermediates=True,
        name="n",
    )
    assert vmapped == [
        "(n) jvp", "(n) jvp:vmap", "(n) jvp:vmap:impl", "(n) jvp:abstract",
        "(n) jvp:abstract", "(n) jvp:transpose", "(n) jvp:transpose:vmap",
        "(n) jvp:transpose:vmap:impl",
    ]  # fmt: skip


def test_unvmap_primitives_on_numbers_under_jit():
    x = jnp.array([0.0, 2.0])
    for prim, want in ((bwi.unvmap_any_p, True), (bwi.unvmap_all_p, False)):
        out = jax.jit(prim.bind)(x)
        assert out.dtype == jnp.bool_ and bool(out) is want
    assert jax.jit(bwi.unvmap_max_p.bind)(x).dtype == jnp.float32
