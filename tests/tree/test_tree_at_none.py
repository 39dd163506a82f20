"""`tree_at` where functions that test for `None` (as diffrax's do)."""

import equinox as eqx
import jax.numpy as jnp

import boxwood as bw


def _not_none(tree):
    return [x for x in tree if x is not None]


def test_where_sees_nones_as_equinox_does():
    tree = (None, jnp.array(1.0), None)
    for tree_at in (bw.tree_at, eqx.tree_at):
        out = tree_at(_not_none, tree, replace_fn=lambda x: x + 1)
        assert out[0] is None and out[2] is None and out[1] == 2.0
    # nothing selected: nothing replaced, replace_fn never called
    out = bw.tree_at(_not_none, (None, None), replace_fn=lambda x: x.astype(int))
    assert out == (None, None)


def test_selecting_a_none_still_works():
    assert bw.tree_at(lambda t: t[0], (None, 1), 2) == (2, 1)
