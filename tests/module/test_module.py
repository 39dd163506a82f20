import abc
import copy
import dataclasses
import gc
import pickle
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw


class Linear(bw.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = bw.field(static=True, default=jax.nn.relu)

    def __call__(self, x):
        return self.activation(self.weight @ x + self.bias)


class MLP(bw.Module):
    layers: list
    depth: int = bw.field(static=True)

    def __init__(self, depth, size, *, key):
        keys = jax.random.split(key, depth)
        self.layers = [
            Linear(jax.random.normal(k, (size, size)), jnp.zeros(size)) for k in keys
        ]
        self.depth = depth

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_dataclass_init_and_fields():
    lin = Linear(jnp.ones((2, 3)), jnp.zeros(2))
    assert [f.name for f in dataclasses.fields(lin)] == ["weight", "bias", "activation"]
    assert lin.activation is jax.nn.relu
    assert dataclasses.is_dataclass(lin)


def test_static_field_in_treedef_dynamic_in_leaves():
    lin = Linear(jnp.ones((2, 3)), jnp.zeros(2))
    leaves, treedef = jax.tree_util.tree_flatten(lin)
    assert len(leaves) == 2
    assert leaves[0] is lin.weight
    other = Linear(jnp.ones((2, 3)), jnp.zeros(2), jax.nn.tanh)
    assert jax.tree_util.tree_structure(other) != treedef


def test_custom_init_and_unflatten_does_not_rerun_init(getkey):
    calls = []

    class Counted(bw.Module):
        x: jax.Array

        def __init__(self, x):
            calls.append(1)
            self.x = x

    c = Counted(jnp.ones(2))
    assert calls == [1]
    leaves, treedef = jax.tree_util.tree_flatten(c)
    rebuilt = treedef.unflatten([jnp.zeros(2)])
    assert calls == [1]
    assert type(rebuilt) is Counted
    assert jnp.all(rebuilt.x == 0)
    doubled = jax.tree_util.tree_map(lambda a: a * 2, MLP(2, 3, key=getkey()))
    assert isinstance(doubled, MLP) and doubled.depth == 2


def test_assignment_after_init_is_an_error():
    lin = Linear(jnp.ones((2, 3)), jnp.zeros(2))
    with pytest.raises(
        dataclasses.FrozenInstanceError,
        match=r"(?s)Cannot assign `Linear.bias`.*tree_at\(lambda m: m.bias",
    ):
        lin.bias = jnp.ones(2)
    with pytest.raises(dataclasses.FrozenInstanceError, match="Linear.weight"):
        del lin.weight


def test_assigning_a_non_field_in_init_is_an_error():
    class Bad(bw.Module):
        x: int

        def __init__(self):
            self.x = 1
            self.y = 2

    with pytest.raises(
        AttributeError, match=r"Cannot set `Bad.y`: it is not a field.*`y: SomeType`"
    ):
        Bad()


def test_unassigned_field_is_named():
    class Half(bw.Module):
        a: jax.Array
        b: jax.Array

        def __init__(self):
            self.a = jnp.ones(1)

    with pytest.raises(
        TypeError, match=r"`Half.__init__` did not assign the field `b`"
    ):
        Half()


def test_unassigned_field_with_default_is_filled():
    class WithDefaults(bw.Module):
        a: int = 3
        b: list = dataclasses.field(default_factory=list)

        def __init__(self):
            pass

    w = WithDefaults()
    assert w.a == 3 and w.b == []


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, {1}])
def test_unhashable_static_values_are_accepted(value):
    # as in Equinox: structures are compared with `==`, never hashed by boxwood
    class Cfg(bw.Module):
        x: jax.Array
        sizes: object = bw.field(static=True)

    with pytest.warns(UserWarning, match=r"`Cfg\.sizes` is a static field holding"):
        cfg = Cfg(jnp.ones(2), value)  # it can change in place: warned, accepted
    leaves, treedef = jax.tree_util.tree_flatten(cfg)
    assert jax.tree_util.tree_unflatten(treedef, leaves).sizes is value
    assert float(jax.tree_util.tree_map(lambda v: v + 1, cfg).x[0]) == 2.0
    assert float(bw.filter_jit(lambda c: c.x + 1)(cfg)[0]) == 2.0
    assert bw.filter_jit(lambda c: c)(cfg).sizes == value


@pytest.mark.parametrize("value", [np.ones(2), jnp.ones(2), (1, jnp.ones(2))])
def test_arrays_in_static_fields_warn_once(value):
    class Cfg(bw.Module):
        sizes: object = bw.field(static=True)

    with pytest.warns(
        UserWarning,
        match=r"`Cfg.sizes` is a static field but holds an array.*field\(static=False\)",
    ):
        assert Cfg(value).sizes is value
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Cfg(value)  # once per class and field


def test_static_field_with_custom_init_takes_a_list():
    class Cfg(bw.Module):
        sizes: tuple = bw.field(static=True)

        def __init__(self, sizes):
            self.sizes = sizes

    assert Cfg((1, 2)).sizes == (1, 2)
    with pytest.warns(UserWarning, match="holding a list.*Use a tuple"):
        assert Cfg([1, 2]).sizes == [1, 2]


def test_check_init_runs_for_each_class_in_mro():
    seen = []

    class Base(bw.Module):
        x: int

        def __check_init__(self):
            seen.append("base")
            if self.x < 0:
                raise ValueError("x must be non-negative")

    class Child(Base):
        y: int

        def __check_init__(self):
            seen.append("child")

    Child(1, 2)
    assert seen == ["child", "base"]  # along the MRO, as in Equinox
    with pytest.raises(ValueError, match="x must be non-negative"):
        Child(-1, 2)


def test_converter_runs_after_init_not_on_unflatten():
    class Conv(bw.Module):
        x: jax.Array = bw.field(converter=jnp.asarray)

        def __init__(self, x):
            self.x = x

    c = Conv([1.0, 2.0])
    assert isinstance(c.x, jax.Array)
    rebuilt = jax.tree_util.tree_structure(c).unflatten([None])
    assert rebuilt.x is None
    with pytest.raises(TypeError, match="converter"):
        bw.field(converter=3)


def test_inheritance_of_fields_and_custom_init():
    class Base(bw.Module):
        a: int

        def __init__(self, a):
            self.a = a
            self.b = a + 1

        b: int = 0

    class Child(Base):
        pass

    c = Child(1)
    assert (c.a, c.b) == (1, 2)

    class Plain(bw.Module):
        a: int

    class PlainChild(Plain):
        b: int

    assert [f.name for f in dataclasses.fields(PlainChild)] == ["a", "b"]
    assert PlainChild(1, 2).b == 2


def test_super_init_inside_custom_init():
    class Base(bw.Module):
        a: int

        def __init__(self, a):
            self.a = a

    class Child(Base):
        b: int

        def __init__(self, a, b):
            super().__init__(a)
            self.b = b

    c = Child(1, 2)
    assert (c.a, c.b) == (1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.a = 3


def test_subclass_adding_fields_to_a_custom_init_rebuilds_every_field():
    class Base(bw.Module):
        a: jax.Array

        def __init__(self, a):
            self.a = a

    class Child(Base):
        b: jax.Array = None
        tag: str = bw.field(static=True, default="child")

    c = Child(jnp.ones(2))
    rebuilt = jax.tree_util.tree_map(lambda x: x * 3, c)
    assert type(rebuilt) is Child and rebuilt.tag == "child" and rebuilt.b is None
    assert jnp.array_equal(rebuilt.a, jnp.full(2, 3.0))
    with_b = jax.tree_util.tree_structure(c).unflatten([jnp.zeros(1)])
    assert jnp.array_equal(with_b.a, jnp.zeros(1))


def test_fields_named_like_init_parameters_and_keywords_naming_fields():
    class Odd(bw.Module):
        args: jax.Array
        kw: jax.Array
        self_: int = bw.field(static=True)

        def __init__(self, args, *, kw, self_=7):
            self.args = args
            self.kw = kw * 2
            self.self_ = self_

    odd = Odd(jnp.ones(1), kw=jnp.ones(1))  # `kw=` names a field: still the user's
    assert jnp.array_equal(odd.kw, jnp.full(1, 2.0)) and odd.self_ == 7
    odd = Odd(args=jnp.zeros(1), kw=jnp.ones(1), self_=3)
    assert odd.self_ == 3 and jnp.array_equal(odd.args, jnp.zeros(1))
    back = jax.tree_util.tree_map(lambda x: x + 1, odd)  # no `__init__` (no doubling)
    assert jnp.array_equal(back.kw, jnp.full(1, 3.0)) and back.self_ == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        Odd(jnp.ones(1), kw=jnp.ones(1), nope=1)


def test_abstract_var_must_be_resolved():
    class Abstract(bw.Module):
        size: bw.AbstractVar[int]
        kind: bw.AbstractClassVar[str]

    with pytest.raises(
        TypeError,
        match=r"Can't instantiate abstract class `Abstract` with abstract class attributes `kind` and abstract attributes `size`: define them",
    ):
        Abstract()

    class Half(Abstract):
        size: int

    with pytest.raises(
        TypeError,
        match=r"abstract class `Half` with abstract class attributes `kind`: define it",
    ):
        Half(3)

    class Concrete(Half):
        kind = "conv"

    assert Concrete(3).size == 3
    assert [f.name for f in dataclasses.fields(Concrete)] == ["size"]


def test_abstract_var_string_annotation_and_property():
    class Abstract(bw.Module):
        size: "bw.AbstractVar[int]"

    class ByProperty(Abstract):
        @property
        def size(self):
            return 4

    with pytest.raises(TypeError, match="abstract attributes `size`"):
        Abstract()
    assert ByProperty().size == 4


def test_abc_abstractmethod():
    class Abstract(bw.Module):
        @abc.abstractmethod
        def __call__(self, x): ...

    with pytest.raises(TypeError, match="abstract"):
        Abstract()


def test_dataclasses_replace_and_fields():
    lin = Linear(jnp.ones((2, 3)), jnp.zeros(2))
    other = dataclasses.replace(lin, activation=jax.nn.tanh)
    assert other.activation is jax.nn.tanh and other.weight is lin.weight


def test_key_paths_name_fields(getkey):
    mlp = MLP(2, 3, key=getkey())
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(mlp)[0]
    ]
    assert paths == [
        ".layers[0].weight",
        ".layers[0].bias",
        ".layers[1].weight",
        ".layers[1].bias",
    ]
    assert isinstance(
        jax.tree_util.tree_flatten_with_path(mlp)[0][0][0][0], jax.tree_util.GetAttrKey
    )


def test_plain_jax_transforms_accept_modules(getkey):
    mlp = MLP(2, 3, key=getkey())
    x = jnp.ones(3)
    out = jax.jit(lambda m, x: m(x))(mlp, x)
    assert jnp.allclose(out, mlp(x))
    grads = jax.grad(lambda m: jnp.sum(m(x)))(mlp)
    assert isinstance(grads, MLP) and grads.layers[0].weight.shape == (3, 3)
    batched = jax.vmap(lambda m, x: m(x), in_axes=(None, 0))(mlp, jnp.ones((5, 3)))
    assert batched.shape == (5, 3)


def test_repr_is_readable_tree(getkey):
    mlp = MLP(2, 3, key=getkey())
    text = repr(mlp)
    assert text.startswith(
        "MLP(\n  layers=[\n    Linear(weight=f32[3,3], bias=f32[3], activation=<function relu>),"
    )
    assert "depth=2" in text
    assert (
        repr(Linear(np.ones((1, 1)), 1.0))
        == "Linear(weight=f64[1,1](numpy), bias=1.0, activation=<function relu>)"
    )


def test_eq_and_hash():
    a = Linear(jnp.ones(2), jnp.ones(2))
    b = Linear(jnp.ones(2), jnp.ones(2))
    assert a == b
    assert not (a == Linear(jnp.ones(2), jnp.zeros(2)))

    class Static(bw.Module):
        x: int

    assert hash(Static(1)) == hash(Static(1))
    # modules holding arrays hash by identity (so `jax.jit(model)` can cache on them)
    assert hash(a) == hash(a) and isinstance(hash(a), int)


def test_jax_jit_of_a_module_as_function():
    lin = Linear(jnp.eye(2), jnp.zeros(2))
    assert jnp.allclose(jax.jit(lin)(jnp.ones(2)), jax.nn.relu(jnp.ones(2)))


def test_module_with_arrays_in_static_field_warns():
    class Holder(bw.Module):
        inner: object = bw.field(static=True)

    with pytest.warns(
        UserWarning, match=r"`Holder.inner` is a static field but holds an array"
    ):
        Holder(Linear(jnp.ones(2), jnp.ones(2)))

    class Static(bw.Module):
        x: int

    assert Holder(Static(1)).inner == Static(1)


def test_bound_methods_are_pytrees_with_the_modules_leaves():
    lin = Linear(jnp.ones((2, 2)), jnp.zeros(2))
    method = lin.__call__
    assert isinstance(method, bw.Module) and method.__self__ is lin
    leaves = jax.tree_util.tree_leaves(method)
    assert all(
        a is b for a, b in zip(leaves, jax.tree_util.tree_leaves(lin), strict=True)
    )
    assert jnp.array_equal(method(jnp.ones(2)), lin(jnp.ones(2)))
    assert jnp.array_equal(
        jax.jit(lambda m, x: m(x))(method, jnp.ones(2)), lin(jnp.ones(2))
    )
    assert Linear.__call__ is method.__func__  # on the class: the plain function
    assert "__call__" not in lin.__dict__
    assert type(lin.weight) is not type(method)  # fields are read as they are


def _double(x):
    return 2 * x


def test_copy_pickle_roundtrip():
    lin = Linear(jnp.ones((2, 2)), jnp.zeros(2), _double)
    for clone in (copy.copy(lin), copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        assert jax.tree_util.tree_structure(clone) == jax.tree_util.tree_structure(lin)
        rebuilt = jax.tree_util.tree_map(lambda x: x + 1, clone)
        assert type(rebuilt) is Linear


def test_modules_are_weakly_referenceable():
    lin = Linear(jnp.ones(2), jnp.ones(2))
    ref = weakref.ref(lin)
    del lin
    gc.collect()
    assert ref() is None


def test_bound_method_under_filter_jit_traces_module(getkey):
    mlp, other = MLP(2, 3, key=getkey()), MLP(2, 3, key=getkey())
    x = jnp.ones(3)
    f, g = bw.filter_jit(mlp.__call__), bw.filter_jit(other.__call__)
    assert jnp.allclose(f(x), mlp(x))
    # the second module's bound method reuses the compiled code: its weights are
    # traced inputs, not constants baked into the first compilation
    assert jnp.allclose(g(x), other(x))
    assert f.cache_info().traces == 1 and g.cache_info().traces == 0


def test_module_construction_under_vmap(getkey):
    keys = jax.random.split(getkey(), 3)
    stacked = jax.vmap(lambda k: MLP(2, 4, key=k))(keys)
    assert stacked.layers[0].weight.shape == (3, 4, 4)
