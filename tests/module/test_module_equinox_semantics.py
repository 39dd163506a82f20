"""Module construction semantics, compared with real Equinox: each test runs the
same program on both libraries and checks the same outcome."""

import dataclasses
import inspect
import warnings
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import boxwood as bw

both = pytest.mark.parametrize("lib", [bw, eqx], ids=["boxwood", "equinox"])
_T = TypeVar("_T")


@both
def test_check_init_runs_along_the_mro_subclass_first(lib):
    seen = []

    class A(lib.Module):
        def __check_init__(self):
            seen.append("A")

    class B(A):
        def __check_init__(self):
            seen.append("B")
            raise ValueError("B refuses")

    class C(B):
        def __check_init__(self):
            seen.append("C")

    with pytest.raises(ValueError, match="B refuses"):
        C()
    assert seen == ["C", "B"]

    class D(A):  # inherits A's check only
        pass

    seen.clear()
    D()
    assert seen == ["A"]


@both
def test_check_init_cannot_assign(lib):
    class A(lib.Module):
        x: int

        def __check_init__(self):
            self.x = 4

    with pytest.raises(dataclasses.FrozenInstanceError):
        A(1)


@both
def test_converter_through_an_init_hierarchy(lib):
    class Plain:
        def __init__(self, x):
            self.x = x

    class B(lib.Module):
        x: Any = lib.field(converter=jnp.asarray)

    class C(Plain, B):  # `Plain.__init__` is used; the converter still runs
        pass

    assert isinstance(C(1).x, jax.Array)


@both
def test_custom_init_with_post_init_warns(lib):
    class A(lib.Module):
        called = False

        def __post_init__(self):
            type(self).called = True

    with pytest.warns(
        UserWarning, match=r"`__init__`\s+method and a\s+`__post_init__`"
    ):

        class B(A):
            def __init__(self):
                pass

    B()
    assert not A.called


@both
def test_assigning_a_method_in_init_raises(lib):
    class A(lib.Module):
        f: Any

        def __init__(self):
            self.f = self.g

        def g(self):
            return 1

    with pytest.raises(ValueError, match="Cannot assign methods in __init__"):
        A()


@both
def test_orig_class(lib):
    class A(lib.Module, Generic[_T]):
        pass

    assert A[int]().__orig_class__ == A[int]


@both
def test_inherited_init_docstring(lib):
    class A(lib.Module):
        pass

    A.__init__.__doc__ = "Hey there!"

    class B(A):
        pass

    assert B.__init__.__doc__ == "Hey there!"


@both
def test_converter_annotations(lib):
    def converter(x: int):
        return str(x)

    class A(lib.Module):
        x: str = lib.field(converter=converter)
        y: str = lib.field(converter=lambda v: v)

    assert A.__init__.__annotations__["x"] is int
    assert A.__init__.__annotations__["y"] is Any


@both
def test_field_not_initialised_wording(lib):
    class A(lib.Module):
        x: int = lib.field(init=False)

    with pytest.raises(TypeError, match="Field 'x' was not initialized"):
        A()


@both
def test_slots_field_initialised_in_init(lib):
    class A(lib.Module):
        __slots__ = ("x",)
        x: int

        def __init__(self):
            self.x = 3
            self.x = 4

    assert A().x == 4


@both
def test_weakref_to_a_module(lib):
    import weakref

    class A(lib.Module):
        x: int

    a = A(1)
    assert weakref.ref(a)() is a


@both
def test_signature_is_the_inits(lib):
    class A(lib.Module):
        x: int
        y: str = "a"

    assert list(inspect.signature(A).parameters) == ["x", "y"]


@both
def test_array_in_static_field_warns(lib):
    class A(lib.Module):
        a: Any = lib.field(static=True)

    with pytest.warns(UserWarning, match="A JAX array is being set as static!"):
        A(jnp.ones(2))


@both
def test_unhashable_static_value_passes_through_transforms(lib):
    class Op(lib.Module):
        x: jax.Array
        structure: tuple = lib.field(static=True)

    structure = ([jax.ShapeDtypeStruct((2,), "float32")], jax.tree.structure(0))
    op = Op(jnp.ones(2), structure)
    assert jax.tree.map(lambda v: v + 1, op).structure is structure
    assert float(jax.jit(lambda o: o.x.sum())(op)) == 2.0
    assert lib.filter_jit(lambda o: o)(op).structure == structure


@both
def test_jax_transformed_callable_in_a_field_warns(lib):
    class A(lib.Module):
        f: Any

    linear = lib.nn.Linear(2, 2, key=jax.random.key(0))
    with pytest.warns(UserWarning, match="Possibly assigning a JAX-transformed"):
        A(jax.vmap(linear))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A(jax.vmap(lambda x: x))  # no arrays inside: no warning


@both
def test_abstract_class_var_in_init_subclass(lib):
    class Parent(lib.Module):
        kind: lib.AbstractClassVar[str]

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            cls.kind = cls.__name__

    class Child(Parent):
        pass

    assert Child().kind == "Child"
