"""`filter_jit` returns outputs of every pytree kind unchanged (both call paths)."""

import dataclasses
import functools
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import boxwood as bw


@jax.tree_util.register_pytree_node_class
class Box:
    def __init__(self, items):
        self.items = items

    def tree_flatten(self):
        return (self.items,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["a", "b"], meta_fields=["tag"]
)
@dataclasses.dataclass
class Data:
    a: object
    b: object
    tag: str = "t"


class Keyed:
    def __init__(self, left, right):
        self.left, self.right = left, right


jax.tree_util.register_pytree_with_keys(
    Keyed,
    lambda k: (
        (
            (jax.tree_util.GetAttrKey("left"), k.left),
            (jax.tree_util.GetAttrKey("right"), k.right),
        ),
        None,
    ),
    lambda aux, ch: Keyed(*ch),
)


@flax.struct.dataclass
class Struct:
    x: object
    y: object
    name: str = flax.struct.field(pytree_node=False, default="s")


class Pair(NamedTuple):
    first: object
    second: object


class Holder(bw.Module):
    inner: object
    scale: float = bw.field(static=True, default=2.0)


def _same(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, jax.Array):
            assert jnp.array_equal(x, y)
        else:
            assert x == y


_KINDS = {
    "box_nested": lambda x: Box((x, (x + 1, [x * 2]))),
    "box_in_box": lambda x: Box(Box({"a": x})),
    "register_dataclass": lambda x: Data((x, x), {"k": Data(x, None)}),
    "with_keys": lambda x: Keyed([x, x + 1], Keyed(x, None)),
    "flax_struct": lambda x: Struct((x, x + 1), {"z": x}),
    "namedtuple": lambda x: Pair((x,), Pair(x, None)),
    "non_string_dict_keys": lambda x: {1: x, 2: (x, {3: x + 1})},
    "none": lambda x: None,
    "module_mix": lambda x: Holder(Box([Struct(x, Data(x, x)), Pair(x, 3)])),
    "static_leaf_inside_custom": lambda x: Box((x, "text", 1.5)),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_output_kinds_round_trip(kind):
    fn = _KINDS[kind]
    f = bw.filter_jit(fn)
    x = jnp.arange(3.0)
    for _ in range(3):  # cold call, first warm call, warm call on the fast path
        out = f(x)
        _same(out, fn(x))


def test_stateful_model_returned_from_a_step(getkey):
    model, state = bw.nn.make_with_state(bw.nn.BatchNorm)(3, axis_name="batch")

    @bw.filter_jit
    def step(model, state, x):
        y, state = jax.vmap(
            model, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
        )(x, state)
        return y, model, state

    x = jnp.arange(12.0).reshape(4, 3)
    for _ in range(3):
        y, model, state = step(model, state, x)
    assert isinstance(state, bw.nn.State)
    assert y.shape == (4, 3)


_BUILDERS = [
    lambda ch: Box(tuple(ch)),
    lambda ch: Data(ch[0], ch[-1]),
    lambda ch: Keyed(ch[0], ch[-1]),
    lambda ch: Struct(ch[0], ch[-1]),
    lambda ch: Pair(ch[0], ch[-1]),
    lambda ch: {i: c for i, c in enumerate(ch)},
    lambda ch: list(ch),
    lambda ch: Holder(tuple(ch)),
]


def _tree(depth):
    @st.composite
    def tree(draw, depth=depth):
        if depth == 0 or draw(st.booleans()):
            return draw(st.sampled_from(["array", "none", "int"]))
        builder = draw(st.integers(0, len(_BUILDERS) - 1))
        n = draw(st.integers(1, 3))
        return (builder, tuple(draw(tree(depth=depth - 1)) for _ in range(n)))

    return tree()


def _make(spec, x):
    if spec == "array":
        return x
    if spec == "none":
        return None
    if spec == "int":
        return 7
    builder, children = spec
    return _BUILDERS[builder]([_make(c, x) for c in children])


@settings(max_examples=25, deadline=None)
@given(spec=_tree(3))
def test_random_nestings_round_trip(spec):
    f = bw.filter_jit(_make)  # `spec` is a static argument (one trace per spec)
    x = jnp.ones(2)
    for _ in range(2):
        _same(f(spec, x), _make(spec, x))
