"""`Partial`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood


class Affine(boxwood.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x, *, shift=0.0):
        return self.weight * x + self.bias + shift


def test_call_matches_functools_partial():
    def f(a, b, c, *, d=0, e=1):
        return (a, b, c, d, e)

    p = boxwood.Partial(f, 1, 2, d=3)
    assert p(9) == functools.partial(f, 1, 2, d=3)(9) == (1, 2, 9, 3, 1)
    assert p(9, d=4, e=5) == (1, 2, 9, 4, 5)  # call-time keywords override


def test_is_a_pytree_of_func_args_and_keywords():
    affine = Affine(jnp.array([2.0]), jnp.array([1.0]))
    p = boxwood.Partial(affine, shift=jnp.array([10.0]))
    leaves = jax.tree_util.tree_leaves(p)
    assert len(leaves) == 3
    doubled = jax.tree.map(lambda a: a * 2, p)
    np.testing.assert_allclose(doubled(jnp.array([1.0])), [4.0 + 2.0 + 20.0])


def test_through_jax_jit():
    affine = Affine(jnp.array([2.0]), jnp.array([1.0]))
    p = boxwood.Partial(affine, jnp.array([3.0]))
    traces = []

    @jax.jit
    def call(p):
        traces.append(None)
        return p()

    np.testing.assert_allclose(call(p), [7.0])
    p2 = boxwood.Partial(Affine(jnp.array([1.0]), jnp.array([0.0])), jnp.array([5.0]))
    np.testing.assert_allclose(call(p2), [5.0])
    assert len(traces) == 1  # the arrays are traced, not baked in


def test_plain_function_through_filter_jit():
    p = boxwood.Partial(jnp.add, jnp.array([1.0, 2.0]))
    out = boxwood.filter_jit(lambda p, x: p(x))(p, jnp.array([1.0, 1.0]))
    np.testing.assert_allclose(out, [2.0, 3.0])


def test_non_callable_is_an_error():
    with pytest.raises(
        TypeError, match="needs a callable as its first argument, got int"
    ):
        boxwood.Partial(3, 4)


def test_subscriptable_as_a_generic_like_equinox():
    # Libraries annotate with `eqx.Partial[...]` at import time (quax does).
    alias = boxwood.Partial[int]
    p = alias(lambda a, b: a + b, 1)
    assert type(p) is boxwood.Partial and p(2) == 3
    assert jax.tree_util.tree_structure(p) == jax.tree_util.tree_structure(
        boxwood.Partial(p.func, 1)
    )
