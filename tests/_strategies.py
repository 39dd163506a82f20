"""Hypothesis strategies shared by the property tests: random nested pytrees and
randomly generated `Module` subclasses.

Every strategy here builds plain data; the tests decide what to check. Trees mix
modules, dicts, lists, tuples, `None`, Python scalars, strings, functions and JAX or
NumPy arrays of random dtypes and values (no 64-bit dtypes: JAX runs in 32-bit),
their shapes drawn from a small fixed set (`SHAPES`).
"""

from __future__ import annotations

import dataclasses
import keyword
from typing import Any

import equinox as eqx
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np

import boxwood as bw

# `derandomize` makes every run draw the same examples (reproducible CI);
# `deadline=None` because the first example of a test pays for compilation.
SETTINGS = dict(max_examples=30, deadline=None, derandomize=True, database=None)

DTYPES = (np.float32, np.float16, np.int32, np.int8, np.uint8, np.bool_)
INEXACT = (np.float32, np.float16)

# Array shapes come from this fixed set (a scalar, an empty array, ranks 1 and
# 2), not drawn freely: every distinct shape is a program of its own to trace and
# compile under `jit`, `grad` or `vmap`, so a few shapes let the examples share
# their programs, while dtypes, values and tree structures stay random.
SHAPES = ((), (0,), (3,), (2, 3))


def relu(x):
    return jnp.maximum(x, 0)


def double(x):
    return x * 2


# Functions are static leaves compared by identity: draw from a fixed pool.
FUNCTIONS = (relu, double, jnp.tanh, len)


def _finite(dtype: Any) -> st.SearchStrategy:
    if np.dtype(dtype).kind == "f":  # small, exactly representable after `* 2`
        return st.integers(-64, 64).map(lambda n: n / 4)
    return None  # hypothesis' own choice for integers and booleans


def np_arrays(dtypes=DTYPES, max_dims: int = 2) -> st.SearchStrategy:
    return st.sampled_from(dtypes).flatmap(
        lambda dtype: hnp.arrays(
            dtype,
            st.sampled_from([s for s in SHAPES if len(s) <= max_dims]),
            elements=_finite(dtype),
        )
    )


def arrays(dtypes=DTYPES) -> st.SearchStrategy:
    """JAX or NumPy arrays."""
    return st.tuples(np_arrays(dtypes), st.booleans()).map(
        lambda pair: jnp.asarray(pair[0]) if pair[1] else pair[0]
    )


names = st.text("abcdefgxyz_", min_size=1, max_size=4).filter(
    lambda s: s.isidentifier() and not keyword.iskeyword(s)
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(-64, 64).map(lambda n: n / 4),
    st.text("abc xyz", max_size=5),
    st.sampled_from(FUNCTIONS),
)
static_values = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.text("abc", max_size=3),
    st.sampled_from(FUNCTIONS),
)


class Box(bw.Module):
    """A module around any subtree, with a static tag."""

    value: Any
    tag: Any = bw.field(static=True, default="box")


class Pair(bw.Module):
    first: Any
    second: Any


def _nodes(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(names, children, max_size=3),
        st.builds(Box, children, static_values),
        st.builds(Pair, children, children),
    )


def trees(leaves: st.SearchStrategy | None = None, max_leaves: int = 8):
    """Random nested pytrees (boxwood modules, containers, scalars, arrays)."""
    if leaves is None:
        leaves = st.one_of(arrays(), scalars)
    return st.recursive(leaves, _nodes, max_leaves=max_leaves)


def plain_trees(leaves: st.SearchStrategy | None = None, max_leaves: int = 8):
    """Random nested pytrees without modules (the same in every library)."""
    if leaves is None:
        leaves = st.one_of(arrays(), scalars)

    def nodes(children):
        return st.one_of(
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.dictionaries(names, children, max_size=3),
        )

    return st.recursive(leaves, nodes, max_leaves=max_leaves)


# --------------------------------------------------------------- array helpers
def is_np_or_jax_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def elementwise(x: Any) -> Any:
    """An elementwise function of array leaves that keeps their dtype exactly."""
    if not is_np_or_jax_array(x):
        return x
    kind = np.dtype(x.dtype).kind
    if kind == "f":
        return x * 2
    if kind == "b":
        return ~x
    return x // 2


def assert_same(a: Any, b: Any) -> None:
    """Same structure; arrays equal in shape, dtype and values (JAX and NumPy alike);
    other leaves equal and of the same type."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb, strict=True):
        if is_np_or_jax_array(x) or is_np_or_jax_array(y):
            assert is_np_or_jax_array(x) and is_np_or_jax_array(y), (x, y)
            assert x.shape == y.shape and x.dtype == y.dtype, (x, y)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            assert type(x) is type(y) and x == y, (x, y)


# ---------------------------------------------------- random Module subclasses
@dataclasses.dataclass(frozen=True)
class FieldSpec:
    name: str
    static: bool
    converter: bool  # `converter=as_float32` on a dynamic field
    has_default: bool


@dataclasses.dataclass(frozen=True)
class ClassSpec:
    """A recipe for a Module subclass: its fields, whether it has its own
    `__init__`, and an optional base recipe it inherits from (adding fields)."""

    name: str
    fields: tuple[FieldSpec, ...]
    custom_init: bool
    base: ClassSpec | None

    def all_fields(self) -> tuple[FieldSpec, ...]:
        # as dataclasses order them: a redefined field keeps its base's position
        own = {f.name: f for f in self.fields}
        inherited = self.base.all_fields() if self.base is not None else ()
        names = {f.name for f in inherited}
        return (
            *(own.get(f.name, f) for f in inherited),
            *(f for f in self.fields if f.name not in names),
        )


def as_float32(x: Any) -> Any:
    if is_module(x):  # a nested module passes through
        return x
    return jnp.asarray(x, jnp.float32)


def _field_specs(min_size: int) -> st.SearchStrategy:
    spec = st.builds(FieldSpec, names, st.booleans(), st.booleans(), st.booleans())
    return st.lists(
        spec, min_size=min_size, max_size=4, unique_by=lambda f: f.name
    ).map(_defaults_last)


def _defaults_last(specs: list) -> tuple:
    # a dataclass needs fields without defaults before those with one
    return tuple(sorted(specs, key=lambda f: f.has_default))


class_names = st.sampled_from(["Layer", "Block", "Net", "Cell"])


def _spec_base() -> st.SearchStrategy:
    return st.builds(ClassSpec, class_names, _field_specs(1), st.booleans(), st.none())


class_specs = st.one_of(
    _spec_base(),
    st.builds(
        ClassSpec, class_names, _field_specs(0), st.booleans(), _spec_base()
    ).filter(lambda s: _valid_order(s.all_fields())),
)


def _valid_order(fields: tuple) -> bool:
    seen_default = False
    for f in fields:
        if f.has_default:
            seen_default = True
        elif seen_default:
            return False
    return True


def uses_custom_init(spec: ClassSpec) -> bool:
    """Whether instances are built through a user `__init__` (own or inherited)."""
    return spec.custom_init or (spec.base is not None and uses_custom_init(spec.base))


def _custom_init(self, values):  # one dict argument, set field by field
    for f in dataclasses.fields(type(self)):
        setattr(self, f.name, values[f.name])


def is_module(x: Any) -> bool:
    return isinstance(x, (bw.Module, eqx.Module))


def _call(self, x):
    total = x
    for f in dataclasses.fields(type(self)):
        value = getattr(self, f.name)
        if is_module(value):
            total = total + value(x)
        elif is_np_or_jax_array(value):
            total = total + jnp.sum(jnp.asarray(value, jnp.float32))
        elif isinstance(value, int) and not isinstance(value, bool):
            total = total * (value + 1)
    return total


def make_class(spec: ClassSpec, lib: Any = bw) -> type:
    """Build the Module subclass that `spec` describes (its base first), with
    `lib` (boxwood, or Equinox for a twin class)."""
    base = make_class(spec.base, lib) if spec.base is not None else lib.Module
    annotations: dict = {}
    body: dict = {}
    for f in spec.fields:
        annotations[f.name] = Any
        kwargs: dict = {}
        if f.has_default:
            kwargs["default"] = "dflt" if f.static else 0.5
        if f.static:
            kwargs["static"] = True
        elif f.converter:
            kwargs["converter"] = as_float32
        body[f.name] = lib.field(**kwargs)
    body["__annotations__"] = annotations
    body["__module__"] = __name__
    body["__qualname__"] = spec.name
    if spec.custom_init:
        body["__init__"] = _custom_init
    body["__call__"] = _call
    return type(spec.name, (base,), body)


def _dynamic_values() -> st.SearchStrategy:
    return st.one_of(
        np_arrays((np.float32,), max_dims=2).map(jnp.asarray),
        np_arrays((np.float32,), max_dims=1),  # NumPy: converted, or kept as is
        st.integers(-4, 4).map(lambda n: n / 2),  # a Python float (a static leaf)
    )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A class recipe and the values of its fields (a field may hold another
    `Recipe`: a nested module)."""

    spec: ClassSpec
    values: dict


@st.composite
def recipes(draw, depth: int = 2) -> Recipe:
    spec = draw(class_specs)
    values = {}
    fields = spec.all_fields()
    for f in fields:
        values[f.name] = draw(static_values if f.static else _dynamic_values())
    dynamic = [f.name for f in fields if not f.static]
    if depth > 1 and dynamic and draw(st.booleans()):
        values[draw(st.sampled_from(dynamic))] = draw(recipes(depth - 1))
    return Recipe(spec, values)


def build(recipe: Recipe, lib: Any = bw) -> Any:
    """An instance of a fresh class made from `recipe` with `lib`."""
    cls = make_class(recipe.spec, lib)
    values = {
        k: build(v, lib) if isinstance(v, Recipe) else v
        for k, v in recipe.values.items()
    }
    if uses_custom_init(recipe.spec):
        return cls(values)
    return cls(**values)


def modules(depth: int = 2) -> st.SearchStrategy:
    """An instance of a freshly generated Module subclass, possibly holding an
    instance of another generated class in one of its dynamic fields."""
    return recipes(depth).map(build)


def trees_with_a_float() -> st.SearchStrategy:
    """`trees()` holding at least one floating-point array (something to
    differentiate)."""
    return trees().filter(
        lambda t: any(bw.is_inexact_array(x) for x in jax.tree_util.tree_leaves(t))
    )


def sin_loss(tree: Any) -> Any:
    """A scalar of every floating-point array of `tree` (JAX or NumPy)."""
    total = jnp.float32(0)
    for leaf in jax.tree_util.tree_leaves(tree):
        if is_np_or_jax_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.inexact):
            total = total + jnp.sum(jnp.sin(leaf).astype(jnp.float32))
    return total
