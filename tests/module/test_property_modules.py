"""Randomly generated Module subclasses (random field names, static/dynamic mix,
nesting, custom `__init__`, converters, inheritance): they flatten and unflatten to
equal trees and give the same results under `filter_jit` as eagerly, on both the C
and the pure-Python call path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood as bw
from _strategies import SETTINGS, assert_same, modules


def test_flatten_unflatten_round_trip():
    @settings(**SETTINGS)
    @given(modules())
    def check(module):
        leaves, treedef = jax.tree_util.tree_flatten(module)
        rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
        assert type(rebuilt) is type(module)
        assert bool(bw.tree_equal(rebuilt, module))
        assert_same(rebuilt, module)
        for name in type(module)._boxwood_field_names:  # every field, read back
            a, b = getattr(rebuilt, name), getattr(module, name)
            assert a is b or bool(bw.tree_equal(a, b))
        # one level down, as `tree_flatten_one_level` sees it
        children, _ = bw.tree_flatten_one_level(module)
        assert len(children) == len(type(module)._boxwood_data)
        # the text and HTML reprs name the class and never raise
        assert repr(module).startswith(type(module).__name__ + "(")
        assert type(module).__name__ in module._repr_html_()

    check()


def test_filter_jit_matches_eager():
    apply = bw.filter_jit(lambda m, x: m(x))
    identity = bw.filter_jit(lambda m: m)
    x = jnp.float32(1.5)

    @settings(**SETTINGS)
    @given(modules())
    def check(module):
        expected = module(x)
        # cold call, then the call that remembers the flat form, then the warm one
        for _ in range(3):
            np.testing.assert_allclose(apply(module, x), expected, rtol=1e-6)
        returned = identity(module)
        assert type(returned) is type(module)
        assert_same(returned, module)
        again = identity(returned)  # a returned module, passed straight back
        np.testing.assert_allclose(apply(again, x), expected, rtol=1e-6)
        assert_same(again, module)

    check()
    info = apply.cache_info()
    assert info.hits > 0 and info.traces <= info.misses


@pytest.mark.parametrize("count", [1, 3])
def test_bound_method_of_a_random_module(count):
    x = jnp.float32(-0.5)

    @settings(**{**SETTINGS, "max_examples": 10})
    @given(modules())
    def check(module):
        method = bw.filter_jit(module.__call__)
        for _ in range(count):
            np.testing.assert_allclose(method(x), module(x), rtol=1e-6)

    check()


def test_tree_at_partition_and_checkpoints_of_random_modules(tmp_path_factory):
    directory = tmp_path_factory.mktemp("random-modules")

    @settings(**SETTINGS)
    @given(modules())
    def check(module):
        leaves = jax.tree_util.tree_leaves(module)
        dynamic, static = bw.partition(module, bw.is_array)
        assert_same(bw.combine(dynamic, static), module)
        assert type(bw.combine(dynamic, static)) is type(module)
        if leaves:  # replace the last leaf, read it back through the fields
            new = jnp.full((2,), 7.0)
            updated = bw.tree_at(
                lambda m: jax.tree_util.tree_leaves(m)[-1], module, new
            )
            assert jax.tree_util.tree_leaves(updated)[-1] is new
            assert type(updated) is type(module)
        path = directory / "module.safetensors"
        bw.save(path, module)
        like = jax.tree_util.tree_map(
            lambda x: np.zeros_like(x) if bw.is_array(x) else x, module
        )
        loaded = bw.load(path, like)
        assert type(loaded) is type(module)
        assert_same(loaded, module)

    check()
