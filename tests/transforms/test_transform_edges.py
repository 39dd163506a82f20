"""Edge cases of the filtered transformations and tree tools: how leaves are split
between JAX and the Python side, and the errors for trees that do not fit."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw


def test_filter_spec_prefix_and_is_leaf():
    tree = {"a": (1, jnp.ones(2)), "b": [jnp.zeros(1), "s"]}
    spec = {"a": bw.is_array, "b": True}
    kept, rest = bw.partition(tree, spec, replace=0)
    assert kept["a"][0] == 0 and kept["b"][1] == "s"
    assert rest["a"][0] == 1 and rest["b"] == [0, 0]
    pairs = [(1, 2), (3,)]
    picked = bw.filter(
        pairs, lambda t: len(t) == 2, is_leaf=lambda x: isinstance(x, tuple)
    )
    assert picked == [(1, 2), None]
    assert bw.filter(pairs, True, inverse=True) == [(None, None), (None,)]


def test_filter_spec_that_does_not_fit():
    with pytest.raises(ValueError, match="`filter_spec` must be a pytree prefix"):
        bw.filter([1, 2], [True])
    with pytest.raises(ValueError, match="leaves are bools or callables"):
        bw.partition([1], [3])


def test_combine_several_and_mismatched():
    assert bw.combine([None, None, 3], [1, None, 4], [None, 2, None]) == [1, 2, 3]
    joined = bw.combine(
        [(None,), None], [None, 5], is_leaf=lambda x: isinstance(x, tuple)
    )
    assert joined == [(None,), 5]
    with pytest.raises(ValueError, match="argument at position 1 does not have"):
        bw.combine([None], [1, 2])


def test_tree_equal_over_three_trees_and_none():
    a = [jnp.ones(2), "x"]
    assert bool(bw.tree_equal(a, [jnp.ones(2), "x"], [jnp.ones(2), "x"]))
    assert not bool(bw.tree_equal(a, a, [jnp.zeros(2), "x"]))
    assert bw.tree_equal(a, a, [jnp.ones(2), "y"]) is False
    assert bw.tree_equal(np.ones(2), np.ones(2), np.ones(2)) is True
    with pytest.raises(ValueError, match="`tree_equal` needs at least one pytree"):
        bw.tree_equal()


def test_filter_jvp_sorts_output_leaves():
    def f(x, y, name):
        return {"moved": x * y, "still": y, "name": name, "n": 2, "nothing": None}

    out, t_out = bw.filter_jvp(
        f, (jnp.array(2.0), jnp.array(3.0), "k"), (jnp.array(1.0), None, None)
    )
    assert out["moved"] == 6.0 and out["still"] == 3.0 and out["name"] == "k"
    assert out["n"] == 2 and out["nothing"] is None
    assert t_out == {
        "moved": t_out["moved"],
        "still": None,
        "name": None,
        "n": None,
        "nothing": None,
    }
    assert t_out["moved"] == 3.0


def test_filter_vjp_with_static_outputs_and_aux():
    def f(x, n, pair):
        return {"o": x * n, "s": "q", "i": jnp.arange(2)}, pair[0] * 2

    out, vjp_fn, aux = bw.filter_vjp(
        lambda *a: (f(*a), "aux"), jnp.array(2.0), 3, (jnp.array(1.0), "z"),
        has_aux=True,
    )  # fmt: skip
    assert aux == "aux" and out[0]["s"] == "q" and out[0]["i"].tolist() == [0, 1]
    ct_x, ct_n, ct_pair = vjp_fn(
        ({"o": jnp.array(1.0), "s": None, "i": None}, jnp.array(1.0))
    )
    assert ct_x == 3.0 and ct_n is None
    assert ct_pair[0] == 2.0 and ct_pair[1] is None


def test_jacobian_structure_and_non_array_aux():
    def f(p):
        return {"y": p["w"] ** 2, "z": jnp.sum(p["w"])}, ("aux", p["w"][0])

    params = {"w": jnp.array([1.0, 2.0]), "n": 3}
    for jac_fn in (bw.filter_jacfwd, bw.filter_jacrev):
        jac, (tag, first) = jac_fn(f, has_aux=True)(params)
        assert tag == "aux" and first == 1.0
        assert jac["y"]["n"] is None and jac["z"]["n"] is None
        assert jac["y"]["w"].tolist() == [[2.0, 0.0], [0.0, 4.0]]
        assert jac["z"]["w"].tolist() == [1.0, 1.0]


def _item(enumeration: type, name: str) -> Any:
    return getattr(enumeration, name)  # the type checker sees the message (a str)


def test_enumeration_from_two_parents():
    class A(bw.Enumeration):
        a = "x"
        b = "y"

    class C(bw.Enumeration):
        c = "z"

    with pytest.warns(UserWarning, match="replaces the inherited 'y'") as record:

        class B(A, C):
            b = "new"
            d = "w"

    assert record[0].filename == __file__
    assert [int(getattr(B, n)._value) for n in "abcd"] == [0, 1, 2, 3]
    assert [B[getattr(B, n)] for n in "abcd"] == ["x", "new", "z", "w"]
    a, b, c = _item(A, "a"), _item(A, "b"), _item(C, "c")
    assert bool(B.promote(c) == _item(B, "c"))
    assert bool(B.promote(b) == _item(B, "b"))
    batched = jax.vmap(lambda p: A.where(p, a, b))(jnp.array([True, False]))
    assert A[batched] == "['x' 'y']"
    with pytest.raises(ValueError, match="converts items of the enumerations"):
        A.promote(a)
    with pytest.raises(TypeError, match="can only inherit from enumerations"):

        class Mixed(A, int):  # type: ignore[misc]
            pass


def test_max_traces_count_is_shared_by_copies():
    wrapped = bw.debug.assert_max_traces(lambda x: x + 1, max_traces=2)
    leaves, treedef = jax.tree_util.tree_flatten(wrapped)
    copy = jax.tree_util.tree_unflatten(treedef, leaves)
    wrapped(1)
    copy(2)
    assert bw.debug.get_num_traces(wrapped) == 2
    with pytest.raises(RuntimeError, match="trace number 3"):
        copy(3)
    with pytest.raises(ValueError, match="not wrapped with"):
        bw.debug.get_num_traces(lambda x: x)


def test_backward_nan_prints_the_structure_of_x(capfd):
    grad = bw.filter_grad(lambda x: jnp.sum(bw.debug.backward_nan(x, name="n")[0] ** 2))
    grad((jnp.ones(2), "q", 3))
    jax.effects_barrier()
    out = capfd.readouterr().out
    assert "n:\n   primals=(Array([1., 1.], dtype=float32), None, None)" in out
    assert "cotangents=(Array([2., 2.], dtype=float32), None, None)" in out


def test_store_dce_keeps_non_arrays(capsys):
    @jax.jit
    def f(x):
        a, _, _ = bw.debug.store_dce((x * 2, x + 1, "tag"), name="edges")
        return a

    f(jnp.ones(2))
    bw.debug.inspect_dce(name="edges")
    assert "(f32[2], <DCE'd>, 'tag')" in capsys.readouterr().out


def test_closure_convert_structs_and_errors():
    z = jnp.ones(2)
    g = bw.filter_closure_convert(
        lambda a, t, k=1: ({"v": z * a, "t": t}, k), jnp.ones(2), "t", k=2
    )
    assert g.in_struct == ((jax.ShapeDtypeStruct((2,), jnp.float32), "t"), {"k": 2})
    assert g.out_struct == (
        {"t": "t", "v": jax.ShapeDtypeStruct((2,), jnp.float32)},
        2,
    )
    assert g(jnp.full(2, 3.0), "t", k=2)[0]["v"].tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match=r"non-array arguments \(\(\(None, 'u'\)"):
        g(jnp.ones(2), "u", k=2)
    with pytest.raises(ValueError, match="arrays of other shapes or dtypes"):
        g(jnp.ones(2), jnp.ones(2), k=2)


def test_closure_convert_reads_shapes_without_tracing(monkeypatch):
    # loops convert their body and condition at every trace: the shapes of the
    # example arguments come from their abstract values, not from `eval_shape`
    def no_eval_shape(*args, **kwargs):
        raise AssertionError("jax.eval_shape was called")

    monkeypatch.setattr(jax, "eval_shape", no_eval_shape)

    @jax.jit
    def outer(z):
        weak, wide = jnp.asarray(1.0), np.full((), 2.0)
        g = bw.filter_closure_convert(
            lambda a, s, b: z * a + s + b, jnp.ones(2), weak, wide
        )
        (_, s, b), _ = g.in_struct
        assert s == jax.ShapeDtypeStruct((), jnp.float32)  # weak type dropped
        assert b == jax.ShapeDtypeStruct((), jnp.float32)  # canonical dtype
        return g(jnp.full(2, 3.0), weak, wide)

    assert outer(jnp.ones(2)).tolist() == [6.0, 6.0]


def test_custom_vjp_sees_which_leaves_are_perturbed():
    seen = []

    @bw.filter_custom_vjp
    def f(vjp_arg, y):
        a, b, n = vjp_arg
        return a * y + b**2

    @f.def_fwd
    def f_fwd(perturbed, vjp_arg, y):
        seen.append(perturbed)
        return f(vjp_arg, y), None

    @f.def_bwd
    def f_bwd(residuals, g, perturbed, vjp_arg, y):
        a, b, n = vjp_arg
        return (g * y if perturbed[0] else None, 2 * b * g, None)

    grad_b = jax.grad(lambda b: f((jnp.ones(2), b, 3), jnp.array(2.0)).sum())
    assert grad_b(jnp.array([3.0, 4.0])).tolist() == [6.0, 8.0]
    assert seen[-1] == (False, True, False)
    with pytest.raises(ValueError, match=r"with respect to `args\[0\]`"):
        jax.grad(lambda y: f((jnp.ones(2), jnp.ones(2), 3), y).sum())(jnp.array(2.0))


def test_filter_shard_with_a_tree_of_shardings():
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    out = bw.filter_shard((jnp.ones(2), "s", 3), (one, None, None))
    assert out[1:] == ("s", 3) and out[0].sharding == one
    traced = bw.filter_jit(lambda x: bw.filter_shard((x, "s"), one))(jnp.ones(2))
    assert traced[1] == "s"


def test_error_if_with_host_predicates_and_indices():
    x = jnp.ones(2)
    assert bw.error_if(x, np.array([False, False]), "m") is x
    with pytest.raises(bw.BoxwoodRuntimeError, match="second"):
        bw.branched_error_if(x, np.array([False, True]), np.int32(1), ["a", "second"])
    checked = jax.jit(lambda v: bw.branched_error_if(v, v > 5, 1, ["a", "b"]))(x)
    assert checked.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="at least one array"):
        jax.jit(lambda v: (bw.error_if("text", v[0] > 5, "m"), v)[1])(x)


def test_tree_flatten_one_level_refuses_a_node_containing_itself():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        bw.tree_flatten_one_level(loop)
    children, treedef = bw.tree_flatten_one_level({"b": (1, 2), "a": None})
    assert children == [None, (1, 2)] and treedef.num_leaves == 2
