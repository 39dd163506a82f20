"""Modules decorated by jaxtyping (`@jaxtyped(typechecker=beartype)`, what
`jaxtyping.install_import_hook` does to every class): rebuilding never goes
through the decorated `__init__`, and type errors are jaxtyping's own."""

import jax
import jax.numpy as jnp
import jaxtyping
import pytest
from jaxtyping import Array, Float

import boxwood as bw

beartype = pytest.importorskip("beartype")  # an optional test dependency


def _checked(cls):
    return jaxtyping.jaxtyped(typechecker=beartype.beartype)(cls)


def test_decorated_module_through_tree_map_and_filter_jit():
    @_checked
    class A(bw.Module):
        x: jax.Array

    out = bw.filter_jit(lambda a: a)(jax.tree.map(lambda v: v + 1, A(jnp.ones(2))))
    assert float(out.x[0]) == 2.0
    again = bw.filter_jit(lambda a: jax.tree.map(lambda v: v * 2, a))(out)
    assert float(again.x[0]) == 4.0
    leaves, treedef = jax.tree_util.tree_flatten(again)
    assert float(treedef.unflatten(leaves).x[1]) == 4.0


def test_decorated_module_with_a_custom_init_and_a_static_field():
    @_checked
    class B(bw.Module):
        w: Float[Array, "n"]
        n: int = bw.field(static=True)

        def __init__(self, n: int):
            self.w = jnp.zeros(n)
            self.n = n

    b = B(3)
    mapped = jax.tree.map(lambda v: v + 1, b)
    assert mapped.n == 3 and float(mapped.w.sum()) == 3.0
    out = bw.filter_jit(lambda m: m)(mapped)
    assert out.n == 3 and out.w.shape == (3,)


def test_wrong_shape_raises_jaxtypings_error():
    @_checked
    class C(bw.Module):
        x: Float[Array, "3"]

    C(jnp.ones(3))
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'x'"):
        C(jnp.ones(2))
    # a rebuild does not check: inside a transform the leaves may be anything
    # (tracers, `None`s, other shapes)
    assert jax.tree.map(lambda v: v[:2], C(jnp.ones(3))).x.shape == (2,)


def test_no_keyword_added_to_init():
    import inspect

    class D(bw.Module):
        x: int

    assert list(inspect.signature(D.__init__).parameters) == ["self", "x"]
    assert list(inspect.signature(D).parameters) == ["x"]
