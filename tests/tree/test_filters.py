import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import boxwood as bw


class Pair(bw.Module):
    a: object
    b: object
    tag: str = bw.field(static=True, default="pair")


def test_predicates():
    assert (
        bw.is_array(jnp.ones(2))
        and bw.is_array(np.ones(2))
        and bw.is_array(np.float32(1))
    )
    assert not bw.is_array(1.0)
    assert (
        bw.is_array_like(1.0) and bw.is_array_like(True) and not bw.is_array_like("a")
    )
    assert bw.is_inexact_array(jnp.ones(2)) and not bw.is_inexact_array(
        jnp.ones(2, int)
    )
    assert bw.is_inexact_array(np.ones(2, np.complex64))
    assert bw.is_inexact_array_like(1.0) and bw.is_inexact_array_like(2j)
    assert not bw.is_inexact_array_like(1) and not bw.is_inexact_array_like(
        jnp.ones(2, int)
    )


def test_filter_with_callable_and_inverse():
    tree = [jnp.ones(2), 3, "a", Pair(jnp.zeros(1), 1.0)]
    kept = bw.filter(tree, bw.is_array)
    assert kept[1] is None and kept[2] is None and kept[3].b is None
    assert kept[0] is tree[0] and kept[3].a is tree[3].a
    rest = bw.filter(tree, bw.is_array, inverse=True, replace=0)
    assert rest[0] == 0 and rest[1] == 3 and rest[3].b == 1.0


def test_filter_spec_prefix_of_bools_and_callables():
    tree = Pair([jnp.ones(2), 2], {"x": jnp.zeros(1), "y": "s"})
    spec = Pair(True, bw.is_array)
    out = bw.filter(tree, spec)
    assert out.a[1] == 2 and out.b["y"] is None and out.b["x"] is tree.b["x"]


def test_filter_spec_bad_leaf():
    with pytest.raises(
        ValueError,
        match=r"`filter_spec` must be a pytree prefix.*bools or callables.*str",
    ):
        bw.filter([1, 2], ["yes", True])


def test_partition_combine_roundtrip_module():
    tree = Pair(jnp.ones(2), "relu")
    dyn, static = bw.partition(tree, bw.is_array)
    assert static.a is None and dyn.b is None and static.tag == "pair"
    assert bw.tree_equal(bw.combine(dyn, static), tree)


def test_combine_needs_an_argument():
    with pytest.raises(TypeError, match="at least one pytree"):
        bw.combine()


def test_combine_with_is_leaf():
    a = [(1, 2), None]
    b = [None, (3, 4)]
    assert bw.combine(a, b, is_leaf=lambda x: isinstance(x, tuple)) == [(1, 2), (3, 4)]


leaf_values = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=3),
    st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=3).map(
        np.asarray
    ),
)
trees = st.recursive(
    leaf_values,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), children, max_size=3),
        st.builds(Pair, children, children),
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(trees)
def test_partition_combine_roundtrip_property(tree):
    dyn, static = bw.partition(tree, bw.is_array)
    assert all(bw.is_array(x) for x in jax.tree_util.tree_leaves(dyn))
    assert not any(bw.is_array(x) for x in jax.tree_util.tree_leaves(static))
    assert bw.tree_equal(bw.combine(dyn, static), tree)
    assert bw.tree_equal(bw.combine(static, dyn), tree)


@settings(max_examples=60, deadline=None)
@given(trees)
def test_filter_inverse_complement_property(tree):
    kept = jax.tree_util.tree_leaves(bw.filter(tree, bw.is_array_like))
    dropped = jax.tree_util.tree_leaves(bw.filter(tree, bw.is_array_like, inverse=True))
    assert len(kept) + len(dropped) == len(jax.tree_util.tree_leaves(tree))
