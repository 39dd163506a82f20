import collections

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from hypothesis import given, settings
from hypothesis import strategies as st

import boxwood as bw
from boxwood._module._flat_build import compile_builder

# every test runs on the compiled and the Python warm-call path (conftest.py)

Point = collections.namedtuple("Point", ["x", "y"])


class Lin(bw.Module):
    w: jax.Array
    b: object
    act: object = bw.field(static=True, default=jnp.tanh)


class Custom(bw.Module):
    x: object

    def __init__(self, x):
        raise AssertionError("rebuilding must not call __init__")


class EqxLin(eqx.Module):
    w: jax.Array


def same(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb)) and type(a) is type(b)


def _bare_custom():
    obj = object.__new__(Custom)
    obj.__dict__.update(x=jnp.ones(1))
    return obj


def test_builder_matches_unflatten_on_mixed_tree():
    model = [Lin(jnp.ones(2), jnp.zeros(2)), Lin(jnp.ones(3), None, jnp.sin)]
    tree = (
        model,
        optax.adam(1e-3).init(model),
        {"b": Point(jnp.ones(1), 2.0), "a": None},
        EqxLin(jnp.ones(4)),
        _bare_custom(),
    )
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    built = compile_builder(treedef)(leaves)
    assert same(built, treedef.unflatten(leaves))
    assert (
        built[0][1].act is jnp.sin and type(built[1][0]).__name__ == "ScaleByAdamState"
    )
    assert isinstance(built[3], EqxLin) and type(built[4]) is Custom


def test_builder_output_is_usable_module():
    lin = Lin(jnp.ones(2), jnp.zeros(2))
    leaves, treedef = jax.tree_util.tree_flatten(lin)
    built = compile_builder(treedef)(leaves)
    assert jnp.allclose(built.w, 1.0) and jax.tree_util.tree_structure(built) == treedef
    doubled = jax.tree_util.tree_map(lambda a: 2 * a, built)
    assert jnp.allclose(doubled.w, 2.0)


def test_very_deep_tree_falls_back_to_unflatten():
    tree = jnp.ones(1)
    for _ in range(100):
        tree = [tree]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    build = compile_builder(treedef)
    assert build.__name__ == "unflatten"
    assert same(build(leaves), tree)


nodes = st.recursive(
    st.just("leaf"),
    lambda c: st.one_of(
        st.lists(c, max_size=3).map(list),
        st.lists(c, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abc"), c, max_size=3),
        st.builds(Point, c, c),
        st.builds(lambda w, b: Lin(w, b), c, c),
        st.just(None),
    ),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(nodes)
def test_builder_property(shape):
    counter = iter(range(1000))
    tree = jax.tree_util.tree_map(lambda _: jnp.asarray(next(counter)), shape)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    assert same(compile_builder(treedef)(leaves), treedef.unflatten(leaves))


def test_builder_with_constants_takes_only_the_other_leaves():
    tree = {"a": [jnp.ones(1), "tag", jnp.zeros(2)], "b": Point(3, jnp.ones(3))}
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    constants = {i: x for i, x in enumerate(leaves) if not isinstance(x, jax.Array)}
    dynamic = [x for x in leaves if isinstance(x, jax.Array)]
    built = compile_builder(treedef, constants)(dynamic)
    assert same(built, tree) and built["a"][1] == "tag" and built["b"].x == 3


def test_deep_tree_fallback_with_constants():
    tree = ["const", jnp.ones(1)]
    for _ in range(100):
        tree = [tree]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    built = compile_builder(treedef, {0: "const"})([leaves[1]])
    assert same(built, tree)


@jax.tree_util.register_pytree_node_class
class Pair:
    """A non-Module node whose children are subtrees (a tuple and a module)."""

    def __init__(self, left, right):
        self.left, self.right = left, right

    def tree_flatten(self):
        return (self.left, self.right), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_builder_rebuilds_other_nodes_whose_children_are_subtrees():
    tree = [Pair((jnp.ones(1), jnp.zeros(2)), Lin(jnp.ones(2), jnp.zeros(2))), 3.0]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    built = compile_builder(treedef)(leaves)
    assert same(built, treedef.unflatten(leaves))
    assert isinstance(built[0], Pair) and isinstance(built[0].right, Lin)


def test_filter_jit_returns_a_batch_norm_state():
    bn, state = bw.nn.make_with_state(bw.nn.BatchNorm)(3, axis_name="batch")
    batched = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    step = bw.filter_jit(lambda x, s: batched(x, s))
    for _ in range(2):
        _, state = step(jnp.arange(12.0).reshape(4, 3), state)
    mean, _ = state.get(bn.state_index)
    assert jnp.allclose(mean, (1 - 0.99**2) * jnp.array([4.5, 5.5, 6.5]))
