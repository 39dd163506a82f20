"""boxwood.internal's custom-primitive helpers, used as lineax uses them: a linear
solve primitive over pytrees, with JVP, transpose and (derived) batching rules."""

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
        want = jax.jacfwd(reference, argnums)(A, B)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # Reverse mode in `b` goes through the transpose rule.
    got = jax.grad(lambda b: solve(A, b).sum())(B)
    want = jax.grad(lambda b: reference(A, b).sum())(B)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    lin = jax.linear_transpose(lambda b: solve(A, b), B)
    np.testing.assert_allclose(lin(jnp.ones(2))[0], want, rtol=1e-5)


def test_derived_batching():
    bs = jnp.stack([B, 2 * B, -B])
    As = jnp.stack([A, A + jnp.eye(2), 2 * A])
    np.testing.assert_allclose(
        jax.vmap(solve, (None, 0))(A, bs), reference(A, bs.T).T, rtol=1e-5
    )
    np.testing.assert_allclose(
        jax.vmap(solve)(As, bs), jax.vmap(reference)(As, bs), rtol=1e-5
    )
    # vmap inside vmap, vmap of grad, grad of vmap, jvp of vmap
    nested = jax.vmap(jax.vmap(solve, (None, 0)), (0, None))(As, bs)
    assert nested.shape == (3, 3, 2)
    np.testing.assert_allclose(nested[1, 2], reference(As[1], bs[2]), rtol=1e-5)
    g = jax.vmap(jax.grad(lambda b: solve(A, b).sum()))(bs)
    g_ref = jax.vmap(jax.grad(lambda b: reference(A, b).sum()))(bs)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5)
    g = jax.grad(lambda b: jax.vmap(solve)(As, jnp.stack([b] * 3)).sum())(B)
    g_ref = jax.grad(lambda b: jax.vmap(reference)(As, jnp.stack([b] * 3)).sum())(B)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5)
    _, t = jax.jvp(lambda m: jax.vmap(solve)(m, bs), (As,), (jnp.ones_like(As),))
    _, t_ref = jax.jvp(
        lambda m: jax.vmap(reference)(m, bs), (As,), (jnp.ones_like(As),)
    )
    np.testing.assert_allclose(t, t_ref, rtol=1e-4)
    # unbatched operands of a batched call: the cotangent is summed over the batch
    g = jax.grad(lambda b: jax.vmap(solve, (0, None))(As, b).sum())(B)
    g_ref = jax.grad(lambda b: jax.vmap(reference, (0, None))(As, b).sum())(B)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5)


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
