"""Differential tests against the installed Equinox on random inputs: every public
function that both libraries define gives the same result (values, structure,
which inputs raise) on the same random pytrees. Fixed cases live in
`test_equinox_differential.py`."""

import dataclasses
import re
from typing import Any

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood as bw
from _strategies import (
    SETTINGS,
    Box,
    Pair,
    arrays,
    assert_same,
    build,
    elementwise,
    is_module,
    is_np_or_jax_array,
    np_arrays,
    plain_trees,
    recipes,
    scalars,
    sin_loss,
    trees,
    trees_with_a_float,
)


class EqxBox(eqx.Module):
    value: Any
    tag: Any = eqx.field(static=True, default="box")


class EqxPair(eqx.Module):
    first: Any
    second: Any


def _swap(tree, box, pair):
    """`tree` with its `Box`/`Pair` modules (of either library) rebuilt as `box` /
    `pair`."""

    def convert(x):
        if isinstance(x, (Box, EqxBox)):
            return box(_swap(x.value, box, pair), x.tag)
        if isinstance(x, (Pair, EqxPair)):
            return pair(_swap(x.first, box, pair), _swap(x.second, box, pair))
        if isinstance(x, (list, tuple, dict)):
            return jax.tree_util.tree_map(
                lambda y: _swap(y, box, pair),
                x,
                is_leaf=lambda y: y is not x and y is not None,
            )
        return x

    return convert(tree)


def to_eqx(tree):
    """The same tree with boxwood's `Box`/`Pair` swapped for Equinox twins."""
    return _swap(tree, EqxBox, EqxPair)


def from_eqx(tree):
    """The same tree with Equinox's twins swapped back for boxwood's classes."""
    return _swap(tree, Box, Pair)


def same_up_to_module_types(a, b):
    """`assert_same` after mapping Equinox's twins back onto boxwood's classes."""
    assert_same(a, from_eqx(b))


NAMES = ["is_array", "is_array_like", "is_inexact_array", "is_inexact_array_like"]


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the kind of failure is compared
        return "raised", type(e).__name__


def test_twin_conversion_round_trips():
    @settings(**SETTINGS)
    @given(trees())
    def check(tree):
        assert_same(from_eqx(to_eqx(tree)), tree)

    check()


def test_filters_partition_combine():
    @settings(**SETTINGS)
    @given(trees(), st.sampled_from(NAMES))
    def check(tree, name):
        ours, theirs = getattr(bw, name), getattr(eqx, name)
        for leaf in jax.tree_util.tree_leaves(tree):
            assert ours(leaf) == theirs(leaf), (name, leaf)
        twin = to_eqx(tree)
        same_up_to_module_types(bw.filter(tree, ours), eqx.filter(twin, theirs))
        same_up_to_module_types(
            bw.filter(tree, ours, inverse=True), eqx.filter(twin, theirs, inverse=True)
        )
        a, b = bw.partition(tree, ours)
        c, d = eqx.partition(twin, theirs)
        same_up_to_module_types(a, c)
        same_up_to_module_types(b, d)
        same_up_to_module_types(bw.combine(a, b), eqx.combine(c, d))

    check()


def _perturbed(tree, data):
    """`tree`, or a copy with one leaf changed (value, dtype or type)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves or not data.draw(st.booleans()):
        return tree
    i = data.draw(st.integers(0, len(leaves) - 1))
    leaves[i] = data.draw(st.one_of(arrays(), scalars))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def test_tree_equal():
    @settings(**SETTINGS)
    @given(trees(), st.data())
    def check(tree, data):
        other = _perturbed(tree, data)
        ours = outcome(lambda: bw.tree_equal(tree, other))
        theirs = outcome(lambda: eqx.tree_equal(to_eqx(tree), to_eqx(other)))
        assert ours[0] == theirs[0]
        if ours[0] == "ok":
            assert bool(ours[1]) == bool(theirs[1]), (tree, other)
            # a Python bool exactly where Equinox gives one
            assert (ours[1] is True) == (theirs[1] is True), (tree, other)
        assert bool(bw.tree_equal(tree, tree))

    check()


def test_tree_at():
    @settings(**SETTINGS)
    @given(trees(), st.data())
    def check(tree, data):
        twin = to_eqx(tree)
        n = len(jax.tree_util.tree_leaves(tree))
        i = data.draw(st.integers(0, n))  # `n`: a node that is not in the tree
        new = data.draw(st.one_of(arrays(), scalars))

        def where(t):
            leaves = jax.tree_util.tree_leaves(t)
            return leaves[i] if i < n else object()

        ours = outcome(lambda: bw.tree_at(where, tree, new))
        theirs = outcome(lambda: eqx.tree_at(where, twin, new))
        assert ours[0] == theirs[0], (ours, theirs)
        if ours[0] == "ok":
            same_up_to_module_types(ours[1], theirs[1])
        # a whole subtree (the first child of the root, if any)
        children, _ = bw.tree_flatten_one_level(tree)
        if children and isinstance(tree, (list, tuple)):
            same_up_to_module_types(
                bw.tree_at(lambda t: t[0], tree, replace_fn=lambda s: "cut"),
                eqx.tree_at(lambda t: t[0], twin, replace_fn=lambda s: "cut"),
            )

    check()


def test_tree_flatten_one_level_and_tree_check():
    @settings(**SETTINGS)
    @given(plain_trees())
    def check(tree):
        a, ta = bw.tree_flatten_one_level(tree)
        b, tb = eqx.tree_flatten_one_level(tree)
        assert ta == tb
        assert len(a) == len(b) and all(x is y for x, y in zip(a, b))
        assert (
            outcome(lambda: bw.tree_check(tree))[0]
            == outcome(lambda: eqx.tree_check(tree))[0]
        )

    check()


def test_filter_jit_and_filter_eval_shape():
    ours = bw.filter_jit(lambda t: jax.tree_util.tree_map(elementwise, t))
    theirs = eqx.filter_jit(lambda t: jax.tree_util.tree_map(elementwise, t))

    @settings(**SETTINGS)
    @given(trees())
    def check(tree):
        same_up_to_module_types(ours(tree), theirs(to_eqx(tree)))
        shapes = bw.filter_eval_shape(
            lambda t: jax.tree_util.tree_map(elementwise, t), tree
        )
        their_shapes = eqx.filter_eval_shape(
            lambda t: jax.tree_util.tree_map(elementwise, t), to_eqx(tree)
        )
        la, ta = jax.tree_util.tree_flatten(shapes)
        lb, tb = jax.tree_util.tree_flatten(from_eqx(their_shapes))
        assert ta == tb
        for x, y in zip(la, lb):
            if isinstance(y, jax.ShapeDtypeStruct):
                assert (x.shape, x.dtype) == (y.shape, y.dtype)
            else:
                assert x == y and type(x) is type(y)

    check()


def test_filter_grad_and_value_and_grad():
    with_a_float = trees_with_a_float()

    @settings(**SETTINGS)
    @given(with_a_float)
    def check(tree):
        twin = to_eqx(tree)
        same_up_to_module_types(
            bw.filter_grad(sin_loss)(tree), eqx.filter_grad(sin_loss)(twin)
        )
        (v1, g1) = bw.filter_value_and_grad(sin_loss)(tree)
        (v2, g2) = eqx.filter_value_and_grad(sin_loss)(twin)
        np.testing.assert_allclose(v1, v2, rtol=1e-6)
        same_up_to_module_types(g1, g2)
        # the updates they produce apply alike
        same_up_to_module_types(bw.apply_updates(tree, g1), eqx.apply_updates(twin, g2))

    check()


def _batched_trees():
    """Trees whose arrays all have a leading axis of 3 (the vmapped one)."""
    batched = np_arrays((np.float32, np.int32, np.float16), max_dims=1).map(
        lambda a: jnp.broadcast_to(jnp.asarray(a), (3, *a.shape))
    )
    return plain_trees(st.one_of(batched, scalars))


def test_filter_vmap():
    @settings(**SETTINGS)
    @given(_batched_trees())
    def check(tree):
        fn = lambda t: jax.tree_util.tree_map(elementwise, t)  # noqa: E731
        # nothing to vectorise: both fail only once the function returns an array
        ours = outcome(lambda: bw.filter_vmap(fn)(tree))
        theirs = outcome(lambda: eqx.filter_vmap(fn)(tree))
        assert ours[0] == theirs[0], (ours, theirs)
        if ours[0] == "ok":
            assert_same(ours[1], theirs[1])

    check()


def test_filter_jvp():
    floats = plain_trees(np_arrays((np.float32,)).map(jnp.asarray) | scalars)

    @settings(**SETTINGS)
    @given(floats)
    def check(tree):
        tangents = jax.tree_util.tree_map(
            lambda x: jnp.ones_like(x) if bw.is_inexact_array(x) else None, tree
        )
        p1, t1 = bw.filter_jvp(sin_loss, (tree,), (tangents,))
        p2, t2 = eqx.filter_jvp(sin_loss, (tree,), (tangents,))
        np.testing.assert_allclose(p1, p2, rtol=1e-6)
        if t2 is None:  # no floating-point input: no tangent in either
            assert t1 is None
        else:
            np.testing.assert_allclose(t1, t2, rtol=1e-6)

    check()


_JITTED = re.compile(r"<PjitFunction of <function (\w+) at 0x[0-9a-f]+>>")


def test_tree_pformat_of_plain_one_line_trees():
    # Equinox's layout differs on purpose for long trees (trailing commas, where
    # lines break) and names builtins differently; short trees read the same
    simple = plain_trees(
        st.one_of(arrays(), scalars.filter(lambda v: v is not len)), max_leaves=4
    )

    @settings(**SETTINGS)
    @given(simple)
    def check(tree):
        ours, theirs = bw.tree_pformat(tree), eqx.tree_pformat(tree)
        # deliberate: a jitted function shows as the function it wraps (one name
        # for a function everywhere, docs/display.md), without an address
        theirs = _JITTED.sub(r"<function \1>", theirs)
        if "\n" not in ours and "\n" not in theirs:
            assert ours == theirs

    check()


@pytest.mark.parametrize("name", NAMES)
def test_is_array_family_on_random_leaves(name):
    @settings(**SETTINGS)
    @given(
        st.one_of(
            arrays(), scalars, np_arrays().map(lambda a: a[()] if a.ndim == 0 else a)
        )
    )
    def check(leaf):
        assert getattr(bw, name)(leaf) == getattr(eqx, name)(leaf)

    check()


def _float_trees():
    return trees(np_arrays((np.float32,)).map(jnp.asarray) | scalars, max_leaves=5)


def test_jacobians_vjp_and_make_jaxpr():
    @settings(**{**SETTINGS, "max_examples": 15})
    @given(_float_trees())
    def check(tree):
        twin = to_eqx(tree)
        for ours, theirs in [
            (bw.filter_jacfwd, eqx.filter_jacfwd),
            (bw.filter_jacrev, eqx.filter_jacrev),
        ]:
            a = outcome(lambda jac=ours: jac(sin_loss)(tree))
            b = outcome(lambda jac=theirs: jac(sin_loss)(twin))
            assert a[0] == b[0], (a, b)  # no float at all: both raise
            if a[0] == "ok":
                same_up_to_module_types(a[1], b[1])
        out1, vjp1 = bw.filter_vjp(sin_loss, tree)
        out2, vjp2 = eqx.filter_vjp(sin_loss, twin)
        np.testing.assert_allclose(out1, out2, rtol=1e-6)
        same_up_to_module_types(vjp1(jnp.float32(1)), vjp2(jnp.float32(1)))
        jaxpr1, shapes1, statics1 = bw.filter_make_jaxpr(sin_loss)(tree)
        jaxpr2, shapes2, statics2 = eqx.filter_make_jaxpr(sin_loss)(twin)
        assert str(jaxpr1) == str(jaxpr2)
        assert shapes1 == shapes2 and statics1 == statics2

    check()


def test_serialised_leaves_read_across_libraries(tmp_path_factory):
    directory = tmp_path_factory.mktemp("serialised")

    def blank(tree):
        return jax.tree_util.tree_map(
            lambda x: np.zeros_like(x) if is_np_or_jax_array(x) else x, tree
        )

    @settings(**SETTINGS)
    @given(trees(arrays() | scalars.filter(lambda v: not callable(v))))
    def check(tree):
        twin = to_eqx(tree)
        path = directory / "leaves.eqx"
        bw.tree_serialise_leaves(path, tree)
        same_up_to_module_types(tree, eqx.tree_deserialise_leaves(path, blank(twin)))
        eqx.tree_serialise_leaves(path, twin)
        assert_same(bw.tree_deserialise_leaves(path, blank(tree)), tree)

    check()


def test_if_array_and_partial():
    @settings(**SETTINGS)
    @given(st.one_of(arrays(), scalars), st.integers(-1, 1))
    def check(leaf, axis):
        assert bw.if_array(axis)(leaf) == eqx.if_array(axis)(leaf)
        ours = bw.Partial(lambda a, b: (a, b), leaf)
        theirs = eqx.Partial(lambda a, b: (a, b), leaf)
        assert ours(1)[0] is theirs(1)[0] is leaf
        assert len(jax.tree_util.tree_leaves(ours)) == len(
            jax.tree_util.tree_leaves(theirs)
        )

    check()


def test_random_module_classes_behave_like_their_equinox_twins():
    apply_theirs = eqx.filter_jit(lambda m, x: m(x))
    # Equinox's call traced into boxwood's program: one compile per random class
    # rather than one in each library
    apply_both = bw.filter_jit(lambda m, t, x: (m(x), apply_theirs(t, x)))
    x = jnp.float32(0.5)

    @settings(**SETTINGS)
    @given(recipes())
    def check(recipe):
        ours, theirs = build(recipe, bw), build(recipe, eqx)
        la, ta = jax.tree_util.tree_flatten(ours)
        lb, tb = jax.tree_util.tree_flatten(theirs)
        assert ta.num_leaves == tb.num_leaves and ta.num_nodes == tb.num_nodes
        assert_same(la, lb)  # the same leaves, in the same order
        for f in dataclasses.fields(ours):  # the same fields, after conversion
            a, b = getattr(ours, f.name), getattr(theirs, f.name)
            if not is_module(a):
                assert_same(a, b)
        expected = theirs(x)
        np.testing.assert_allclose(ours(x), expected, rtol=1e-6)
        np.testing.assert_allclose(*apply_both(ours, theirs, x), rtol=1e-6)
        # partition/combine: the same split
        a, b = bw.partition(ours, bw.is_array)
        c, d = eqx.partition(theirs, eqx.is_array)
        assert_same(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(c))
        assert_same(jax.tree_util.tree_leaves(b), jax.tree_util.tree_leaves(d))

    check()
