"""Properties of the tree functions on random nested pytrees (modules, dicts, lists,
tuples, `None`, Python scalars, strings, functions, JAX and NumPy arrays)."""

import html.parser

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood as bw
from _strategies import (
    INEXACT,
    SETTINGS,
    arrays,
    assert_same,
    elementwise,
    is_np_or_jax_array,
    scalars,
    sin_loss,
    trees,
    trees_with_a_float,
)

FILTERS = [bw.is_array, bw.is_array_like, bw.is_inexact_array, bw.is_inexact_array_like]


def test_partition_combine_round_trip():
    @settings(**SETTINGS)
    @given(trees(), st.sampled_from(FILTERS))
    def check(tree, spec):
        dynamic, static = bw.partition(tree, spec)
        assert_same(bw.combine(dynamic, static), tree)
        assert_same(bw.combine(static, dynamic), tree)
        kept = jax.tree_util.tree_leaves(dynamic)
        assert all(spec(x) for x in kept)
        assert not any(spec(x) for x in jax.tree_util.tree_leaves(static))
        assert len(kept) + len(jax.tree_util.tree_leaves(static)) == len(
            jax.tree_util.tree_leaves(tree)
        )
        assert_same(bw.filter(tree, spec), dynamic)
        assert_same(bw.filter(tree, spec, inverse=True), static)

    check()


def test_filter_jit_of_an_elementwise_function_matches_eager():
    jitted = bw.filter_jit(lambda t: jax.tree_util.tree_map(elementwise, t))

    @settings(**SETTINGS)
    @given(trees())
    def check(tree):
        expected = jax.tree_util.tree_map(elementwise, tree)
        for _ in range(3):  # cold, remembered, warm
            out = jitted(tree)
            # arrays come back as JAX arrays: compare values, shapes and dtypes
            assert_same(out, expected)
            for leaf in jax.tree_util.tree_leaves(out):
                assert not isinstance(leaf, np.ndarray)

    check()


def test_filter_grad_equals_jax_grad_on_the_partitioned_arrays():
    with_a_float = trees_with_a_float()

    @settings(**SETTINGS)
    @given(with_a_float)
    def check(tree):
        grads = bw.filter_grad(sin_loss)(tree)
        diff, static = bw.partition(tree, bw.is_inexact_array)
        expected = jax.grad(lambda d: sin_loss(bw.combine(d, static)))(diff)
        assert_same(grads, expected)
        # and the values themselves: d/dx sum(sin x) = cos x, in x's dtype
        for g, x in zip(
            jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(diff)
        ):
            assert g.dtype == x.dtype
            np.testing.assert_allclose(
                np.asarray(g, np.float32), np.cos(np.asarray(x, np.float32)), atol=2e-3
            )

    check()


def test_tree_at_then_reading_back():
    @settings(**SETTINGS)
    @given(trees(), st.data())
    def check(tree, data):
        leaves = jax.tree_util.tree_leaves(tree)
        if not leaves:
            return
        i = data.draw(st.integers(0, len(leaves) - 1))
        new = data.draw(st.one_of(arrays(), scalars.filter(lambda v: v is not None)))
        updated = bw.tree_at(lambda t: jax.tree_util.tree_leaves(t)[i], tree, new)
        after = jax.tree_util.tree_leaves(updated)
        assert len(after) == len(leaves) and after[i] is new
        for j, (a, b) in enumerate(zip(after, leaves)):
            if j != i:
                assert a is b
        assert jax.tree_util.tree_structure(updated) == jax.tree_util.tree_structure(
            tree
        )
        # replace_fn, on the same node
        if is_np_or_jax_array(leaves[i]):
            again = bw.tree_at(
                lambda t: jax.tree_util.tree_leaves(t)[i], tree, replace_fn=elementwise
            )
            assert_same(jax.tree_util.tree_leaves(again)[i], elementwise(leaves[i]))
        # the original is untouched
        assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(tree), leaves))

    check()


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("property-checkpoints")


def test_checkpoint_safetensors_round_trip(checkpoint_dir):
    @settings(**SETTINGS)
    @given(trees(arrays() | scalars))
    def check(tree):
        path = checkpoint_dir / "tree.safetensors"
        bw.save(path, tree)
        like = jax.tree_util.tree_map(
            lambda x: np.zeros_like(x) if is_np_or_jax_array(x) else x, tree
        )
        loaded = bw.load(path, like)
        assert_same(loaded, tree)

    check()


class _Checker(html.parser.HTMLParser):
    """Parses the HTML repr and checks every tag it opens is closed."""

    VOID = {"br", "hr", "img", "input", "meta", "wbr"}

    def __init__(self):
        super().__init__()
        self.stack = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()


def _check_html(markup):
    checker = _Checker()
    checker.feed(markup)
    checker.close()
    assert not checker.stack, checker.stack


def test_pformat_and_html_repr_never_raise():
    @settings(**SETTINGS)
    @given(trees(arrays() | scalars | st.text(max_size=6)))
    def check(tree):
        text = bw.tree_pformat(tree)
        assert isinstance(text, str) and text
        assert isinstance(repr(bw.Partial(len, tree)), str)
        modules = [
            x
            for x in jax.tree_util.tree_leaves(
                tree, is_leaf=lambda x: isinstance(x, bw.Module)
            )
            if isinstance(x, bw.Module)
        ]
        for module in modules:  # the modules inside, on their own
            _check_html(module._repr_html_())
        wrapped = _Holder(tree)
        markup = wrapped._repr_html_()
        _check_html(markup)
        assert "Holder" in markup and "Holder" in repr(wrapped)

    check()


class _Holder(bw.Module):
    tree: object


@pytest.mark.parametrize("dtype", INEXACT)
def test_strategies_draw_what_they_promise(dtype):
    # the strategies themselves: trees do mix every kind of node and leaf
    seen = set()

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(trees(st.one_of(arrays((dtype,)), scalars)))
    def check(tree):
        for node in jax.tree_util.tree_leaves(
            tree, is_leaf=lambda x: x is not tree and not is_np_or_jax_array(x)
        ):
            seen.add(type(node).__name__)
        for leaf in jax.tree_util.tree_leaves(tree):
            seen.add(type(leaf).__name__)

    check()
    assert {"ndarray", "ArrayImpl", "str", "int", "float"} <= seen, seen
