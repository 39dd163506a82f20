"""Abstract attributes, compared with Equinox's rules (`AbstractVar`,
`AbstractClassVar`)."""

from typing import ClassVar

import equinox as eqx
import pytest

import boxwood as bw


@pytest.mark.parametrize("lib", [bw, eqx], ids=["boxwood", "equinox"])
def test_abstract_class_var_set_in_init_subclass(lib):
    # diffrax's Runge-Kutta solvers set `term_structure` this way
    class Solver(lib.Module):
        term_structure: lib.AbstractClassVar[type]

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            if hasattr(cls, "tableau"):
                cls.term_structure = int

    class Euler(Solver):
        tableau = 1

    class Unfinished(Solver):
        pass

    assert Euler().term_structure is int
    assert Euler.__abstractclassvars__ == frozenset()
    with pytest.raises(TypeError, match="abstract class attributes"):
        Unfinished()


@pytest.mark.parametrize("lib", [bw, eqx], ids=["boxwood", "equinox"])
def test_abstract_sets_follow_the_mro(lib):
    class A(lib.Module):
        x: lib.AbstractVar[int]
        c: lib.AbstractClassVar[int]

    class B(lib.Module):
        x: int

    class C(B, A):  # `B` defines `x` as a field
        c: ClassVar[int]

    assert (A.__abstractvars__, A.__abstractclassvars__) == ({"x"}, {"c"})
    assert (C.__abstractvars__, C.__abstractclassvars__) == (set(), set())
    assert C(1).x == 1

    class D(A):
        c: lib.AbstractVar[int]  # stays a class attribute

    assert (D.__abstractvars__, D.__abstractclassvars__) == ({"x"}, {"c"})


def test_abstract_error_names_everything_left():
    class A(bw.Module):
        x: bw.AbstractVar[int]
        c: bw.AbstractClassVar[int]

    with pytest.raises(
        TypeError,
        match=r"Can't instantiate abstract class `A` with abstract class attributes "
        r"`c` and abstract attributes `x`: define them in `A` or one of its bases",
    ):
        A()


@pytest.mark.parametrize("lib", [bw, eqx], ids=["boxwood", "equinox"])
def test_abstract_declaration_mistakes(lib):
    with pytest.raises(TypeError, match="unsubscripted"):

        class A(lib.Module):
            x: lib.AbstractVar  # type: ignore[type-arg]

    with pytest.raises(TypeError, match="cannot have value"):

        class B(lib.Module):
            x: lib.AbstractClassVar[bool] = True  # type: ignore[misc]


def test_internal_exports_the_abstract_markers():
    import boxwood.internal as bwi

    assert bwi.AbstractVar is bw.AbstractVar
    assert bwi.AbstractClassVar is bw.AbstractClassVar
