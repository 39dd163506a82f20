"""The warm path's key (`_flat_key.call_key`) against `jax.tree_util` as the
oracle: where the walk gives a key, its dynamic leaves are exactly the arrays of
`jax.tree_util.tree_leaves((args, kwargs))`, in order, and two calls with the same
key have the same structure and static leaves. Random calls of arrays, typed PRNG
keys, modules with and without their flat form, containers, named tuples, `None`,
static scalars (a float's sign included) and keywords in any order."""

from __future__ import annotations

import collections
import dataclasses

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings

import boxwood as bw
from _strategies import SETTINGS, arrays, names, scalars, trees
from boxwood._module import _flat_key
from boxwood._module._static_key import strict

Point = collections.namedtuple("Point", ["x", "y"])


def _identity(*args, **kwargs):
    return args, kwargs


def _py_key(args, kwargs):
    dyn = []
    key = _flat_key.call_key(args, kwargs, dyn)
    return None if key is None else (key, dyn)


def _modules(tree):
    found = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, bw.Module):
            found.append(node)
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif isinstance(node, bw.Module):
            stack.extend(getattr(node, f.name) for f in dataclasses.fields(node))
    return found


leaves = st.one_of(
    arrays(),
    scalars,
    st.sampled_from([0.0, -0.0, 1.0, -1.0]),
    st.integers(0, 3).map(jax.random.key),  # typed PRNG keys
)
values = trees(leaves, max_leaves=6)
nodes = st.one_of(values, st.builds(Point, values, values))


def _oracle(args, kwargs):
    """`(dynamic leaves, (treedef, static leaves with their strict form))` of a
    call, from `jax.tree_util`."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), kwargs))
    dyn = [x for x in leaves if isinstance(x, jax.Array)]
    statics = tuple(x for x in leaves if not isinstance(x, jax.Array))
    return dyn, (treedef, statics, tuple(map(strict, statics)))


_SEEN: dict = {}


@settings(**{**SETTINGS, "max_examples": 200})
@given(
    args=st.lists(nodes, max_size=4),
    kwargs=st.dictionaries(names, nodes, max_size=4),
    flat=st.booleans(),
)
def test_the_walk_agrees_with_jax_tree_util(args, kwargs, flat):
    if flat:  # modules carrying their flat form: walked without a flatten
        for m in _modules((args, kwargs)):
            _flat_key.remember(m)
    walked = _py_key(tuple(args), kwargs)
    if walked is None:
        return
    key, dyn = walked
    oracle_dyn, structure = _oracle(args, kwargs)
    assert len(dyn) == len(oracle_dyn)
    assert all(a is b for a, b in zip(dyn, oracle_dyn))
    known = _SEEN.setdefault(key, structure)
    assert known == structure  # one key, one structure and one set of statics


def test_a_walk_is_found_for_plain_calls():
    x = jnp.ones(2)
    m = bw.nn.Linear(2, 2, key=jax.random.key(0))
    _flat_key.remember(m)
    for args, kwargs in [((x, 1.0), {}), ((m, x), {}), ((), {"m": m, "x": x})]:
        assert _py_key(args, kwargs) is not None


def test_keys_differ_where_calls_compile_differently():
    x = jnp.ones(2)
    calls = [
        ((x, 0.0), {}),
        ((x, -0.0), {}),
        ((x, 0), {}),
        ((x,), {"a": 1, "b": 2}),
        ((x,), {"a": 2, "b": 1}),
    ]
    keys = [_py_key(*call) for call in calls]
    assert None not in keys
    assert len({k[0] for k in keys}) == 5
    # keyword order does not matter (sorted, as jax flattens dicts)
    assert _py_key((x,), {"b": 2, "a": 1})[0] == _py_key((x,), {"a": 1, "b": 2})[0]


def test_deep_nesting_agrees():
    deep = jnp.ones(1)
    for _ in range(70):
        deep = (deep,)
    key, dyn = _py_key((deep,), {})
    assert key is not None and len(dyn) == 1


def test_a_numpy_array_declines():
    assert _py_key((np.ones(2),), {}) is None
