import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import boxwood as bw


class Lin(bw.Module):
    w: jax.Array
    b: object
    name: str = bw.field(static=True, default="lin")


class Net(bw.Module):
    layers: list
    extra: object = None


def make_net():
    return Net([Lin(jnp.ones(2), jnp.zeros(2)), Lin(jnp.ones(3), None)])


def test_tree_at_replace_leaf():
    net = make_net()
    new = bw.tree_at(lambda n: n.layers[0].w, net, jnp.full(2, 5.0))
    assert jnp.all(new.layers[0].w == 5.0)
    assert jnp.all(net.layers[0].w == 1.0)  # original untouched
    assert new.layers[1] is not None and new.layers[0].b is net.layers[0].b


def test_tree_at_replace_subtree_and_none():
    net = make_net()
    new = bw.tree_at(lambda n: n.layers[1], net, Lin(jnp.zeros(4), 1.0, "other"))
    assert new.layers[1].name == "other" and new.layers[1].w.shape == (4,)
    filled = bw.tree_at(lambda n: n.layers[1].b, net, jnp.ones(3))
    assert filled.layers[1].b.shape == (3,)
    extra = bw.tree_at(lambda n: n.extra, net, "x")
    assert extra.extra == "x"


def test_tree_at_several_nodes_and_replace_fn():
    net = make_net()
    new = bw.tree_at(
        lambda n: (n.layers[0].w, n.layers[1].w), net, (jnp.zeros(2), jnp.zeros(3))
    )
    assert jnp.all(new.layers[0].w == 0) and jnp.all(new.layers[1].w == 0)
    doubled = bw.tree_at(
        lambda n: [n.layers[0].w, n.layers[1].w], net, replace_fn=lambda x: 2 * x
    )
    assert jnp.all(doubled.layers[1].w == 2)


def test_tree_at_identical_leaves_are_distinguished():
    shared = jnp.ones(2)
    tree = [shared, shared]
    new = bw.tree_at(lambda t: t[1], tree, jnp.zeros(2))
    assert new[0] is shared and jnp.all(new[1] == 0)
    ints = bw.tree_at(lambda t: t[0], [1, 1], 7)
    assert ints == [7, 1]


def test_tree_at_where_sees_the_leaves_of_the_real_tree():
    # `None` is a node without leaves in `where`'s argument too, so a leaf picked
    # by its index is the same leaf as in the real tree
    tree = [None, {"a": None, "b": (1.0, None)}, "x"]
    pick = lambda t: jax.tree_util.tree_leaves(t)[0]  # noqa: E731
    assert bw.tree_at(pick, tree, 5) == [None, {"a": None, "b": (5, None)}, "x"]
    assert jax.tree_util.tree_leaves(tree) == [1.0, "x"]
    # a `None` can still be selected and replaced by position
    assert bw.tree_at(lambda t: t[1]["a"], tree, 7)[1]["a"] == 7
    assert bw.tree_at(lambda t: (t[0], t[2]), tree, (0, 2)) == [0, tree[1], 2]
    # with an `is_leaf` that makes `None` a leaf, `where` sees them as leaves
    none_leaf = lambda x: x is None  # noqa: E731
    pick_second = lambda t: jax.tree_util.tree_leaves(t, is_leaf=none_leaf)[1]  # noqa: E731
    assert bw.tree_at(pick_second, [None, None, 1], 5, is_leaf=none_leaf) == [
        None,
        5,
        1,
    ]


def test_tree_at_errors():
    net = make_net()
    with pytest.raises(ValueError, match=r"exactly one of `replace=` or `replace_fn=`"):
        bw.tree_at(lambda n: n.extra, net)
    with pytest.raises(
        ValueError,
        match=r"not a node of the pytree.*static fields are part of the structure",
    ):
        bw.tree_at(lambda n: n.layers[0].name, net, "new")
    with pytest.raises(ValueError, match=r"not a node of the pytree"):
        bw.tree_at(lambda n: jnp.ones(1), net, 1)
    with pytest.raises(
        ValueError, match=r"selected 2 nodes, so `replace` must be a sequence of 2"
    ):
        bw.tree_at(lambda n: (n.layers[0].w, n.layers[1].w), net, jnp.zeros(2))


def test_tree_at_is_leaf():
    tree = [(1, 2), (3, 4)]
    new = bw.tree_at(lambda t: t[0], tree, "x", is_leaf=lambda x: isinstance(x, tuple))
    assert new == ["x", (3, 4)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=6), st.data())
def test_tree_at_property(values, data):
    i = data.draw(st.integers(0, len(values) - 1))
    tree = {"v": [jnp.asarray(v) for v in values], "s": "static"}
    new = bw.tree_at(lambda t: t["v"][i], tree, jnp.asarray(-1))
    expected = [(-1 if j == i else v) for j, v in enumerate(values)]
    assert [int(x) for x in new["v"]] == expected and new["s"] == "static"


def test_tree_equal():
    assert bw.tree_equal(make_net(), make_net())
    assert not bw.tree_equal(
        make_net(), bw.tree_at(lambda n: n.layers[0].w, make_net(), jnp.zeros(2))
    )
    assert not bw.tree_equal([1], (1,))
    assert not bw.tree_equal(jnp.ones(2), jnp.ones(3))
    assert not bw.tree_equal(jnp.ones(2), jnp.ones(2, dtype=jnp.int32))
    assert bw.tree_equal(jnp.ones(2), jnp.ones(2) + 1e-7, rtol=1e-5)
    assert not bw.tree_equal(jnp.ones(2), jnp.ones(2) + 1e-3, atol=1e-5)
    assert bw.tree_equal(1, 1.0) and not bw.tree_equal(1, 1.0, typematch=True)
    assert bw.tree_equal(np.ones(2), np.ones(2))


def test_tree_equal_under_jit_returns_traced_bool():
    out = jax.jit(lambda a, b: bw.tree_equal(a, b))(jnp.ones(2), jnp.ones(2))
    assert out.dtype == jnp.bool_ and bool(out)


def test_apply_updates_skips_none_and_works_with_optax():
    model = Lin(jnp.ones(2), "static")
    updated = bw.apply_updates(model, Lin(jnp.ones(2), None))
    assert jnp.all(updated.w == 2) and updated.b == "static"
    params = Lin(jnp.ones(2), jnp.ones(2))
    opt = optax.sgd(0.5)
    state = opt.init(params)
    grads = Lin(jnp.ones(2), jnp.ones(2))
    updates, _ = opt.update(grads, state)
    new = bw.apply_updates(params, updates)
    assert jnp.allclose(new.w, 0.5) and jnp.allclose(new.b, 0.5)


def test_tree_pformat():
    text = bw.tree_pformat(make_net(), width=40)
    assert text.splitlines()[0] == "Net("
    assert "Lin(w=f32[2], b=f32[2], name='lin')" in text
    assert bw.tree_pformat(jnp.ones((2, 3)), short_arrays=False).startswith("Array(")
    assert bw.tree_pformat((1,)) == "(1,)"
    assert bw.tree_pformat(jnp.ones(2, jnp.bfloat16)) == "bf16[2]"


def test_tree_pprint(capsys):
    bw.tree_pprint({"a": jnp.zeros((1, 2), jnp.int32)})
    assert capsys.readouterr().out == "{'a': i32[1,2]}\n"
