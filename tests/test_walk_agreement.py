"""The warm path's key is specified once: the C `FastCall` (`_native/_speedups.c`) and
the Python `_flat_cache.call_key` give the same key and the same dynamic leaves
for every call, or both decline it (a real flatten is needed). Random calls of
arrays, typed PRNG keys, modules with and without their flat form, containers,
named tuples, `None`, static scalars (a float's sign included) and keywords in any
order."""

from __future__ import annotations

import collections
import dataclasses

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood as bw
from _strategies import SETTINGS, arrays, names, scalars, trees
from boxwood import _native
from boxwood._jit import _flat_cache

pytestmark = pytest.mark.skipif(
    not _native.active(), reason="compares the C extension with its Python twin"
)

Point = collections.namedtuple("Point", ["x", "y"])


def _identity(*args, **kwargs):
    return args, kwargs


def _c_key(args, kwargs):
    fast = bw.filter_jit(_identity)
    assert isinstance(fast, _native.FastCall)
    return fast._key(*args, **kwargs)


def _py_key(args, kwargs):
    dyn = []
    key = _flat_cache.call_key(args, kwargs, dyn)
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


@settings(**{**SETTINGS, "max_examples": 200})
@given(
    args=st.lists(nodes, max_size=4),
    kwargs=st.dictionaries(names, nodes, max_size=4),
    flat=st.booleans(),
)
def test_c_and_python_give_the_same_key(args, kwargs, flat):
    if flat:  # modules carrying their flat form: walked without a flatten
        for m in _modules((args, kwargs)):
            _flat_cache.remember(m)
    python = _py_key(tuple(args), kwargs)
    c = _c_key(args, kwargs)
    assert (c is None) == (python is None)
    if c is not None:
        assert c[0] == python[0]
        assert [type(k) for k in c[0]] == [type(k) for k in python[0]]
        assert len(c[1]) == len(python[1])
        assert all(a is b for a, b in zip(c[1], python[1]))


def test_keys_differ_where_calls_compile_differently():
    x = jnp.ones(2)
    calls = [
        ((x, 0.0), {}),
        ((x, -0.0), {}),
        ((x, 0), {}),
        ((x,), {"a": 1, "b": 2}),
        ((x,), {"a": 2, "b": 1}),
    ]
    keys = [_c_key(*call) for call in calls]
    assert None not in keys
    assert len({k[0] for k in keys}) == 5
    # keyword order does not matter (sorted, as jax flattens dicts)
    assert _c_key((x,), {"b": 2, "a": 1})[0] == _c_key((x,), {"a": 1, "b": 2})[0]


def test_deep_nesting_is_handed_to_python_and_agrees():
    deep = jnp.ones(1)
    for _ in range(70):  # past the C walk's depth limit of 64
        deep = (deep,)
    c = _c_key((deep,), {})
    python = _py_key((deep,), {})
    assert c is not None and c[0] == python[0]


def test_a_numpy_array_declines_on_both():
    assert _c_key((np.ones(2),), {}) is None
    assert _py_key((np.ones(2),), {}) is None
