"""What a class's hooks put on a Module class stays there, as on Equinox.

Libraries built on Equinox change their classes after the class body runs:
`__init_subclass__` wraps methods (flowjax's bijections unwrap their parameters
this way), class decorators and metaclass hooks replace them, and code patches
them later with `setattr`. Each test runs the same program on boxwood and on
Equinox and checks the same outcome; boxwood's own addition, a bound method that
is a pytree, is checked on boxwood.
"""

import abc
import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import boxwood as bw

both = pytest.mark.parametrize("lib", [bw, eqx], ids=["boxwood", "equinox"])


def tagged(f):
    """A `functools.wraps` wrapper that marks what it returns."""

    @functools.wraps(f)
    def wrapper(self, *args, **kwargs):
        return ("wrapped", f(self, *args, **kwargs))

    return wrapper


def _wrapping_base(lib):
    class Base(lib.Module):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            for name in ("f", "__call__"):
                if name in cls.__dict__:
                    setattr(cls, name, tagged(cls.__dict__[name]))

    return Base


@both
def test_init_subclass_wrapping_a_method_stays(lib):
    class A(_wrapping_base(lib)):
        w: jax.Array

        def f(self, x):
            return self.w * x

        def __call__(self, x):
            return self.w + x

    a = A(jnp.ones(2))
    tag, value = a.f(3.0)
    assert tag == "wrapped" and value.tolist() == [3.0, 3.0]
    assert a(1.0)[0] == "wrapped"
    # the wrapper keeps the function's name and reaches it through `__wrapped__`
    assert A.f.__name__ == "f" and A.f.__wrapped__.__name__ == "f"
    # and a compiled call runs it too
    out = lib.filter_jit(lambda m, x: m.f(x)[1])(a, 2.0)
    assert out.tolist() == [2.0, 2.0]


def test_wrapped_method_binds_as_a_pytree():
    class A(_wrapping_base(bw)):
        w: jax.Array

        def f(self, x):
            return self.w * x

    a = A(jnp.ones(2))
    bound = a.f
    assert type(bound).__name__ == "BoundMethod"
    assert jax.tree_util.tree_leaves(bound) == jax.tree_util.tree_leaves(a)
    assert bw.filter_jit(bound)(2.0)[0] == "wrapped"


def test_init_subclass_sees_the_class_body_as_written():
    seen = {}

    class Base(bw.Module):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            seen[cls.__name__] = type(cls.__dict__["f"])

    class A(Base):
        def f(self):
            return 1

    assert seen == {"A": type(lambda: None)}  # the plain function, as Python has it


@both
def test_class_decorator_replacing_a_method_stays(lib):
    def decorate(cls):
        cls.f = tagged(cls.f)
        return cls

    @decorate
    class B(lib.Module):
        def f(self, x):
            return x

    assert B().f(1) == ("wrapped", 1)


@both
def test_setattr_after_class_creation(lib):
    class C(lib.Module):
        w: jax.Array

        def f(self, x):
            return x

    C.f = lambda self, x: x + 100
    C.g = lambda self: "new"
    c = C(jnp.zeros(1))
    assert c.f(1) == 101
    assert c.g() == "new"
    assert type(c.f).__name__ == "BoundMethod"  # both libraries bind as a pytree
    assert jax.tree_util.tree_leaves(c.g) == jax.tree_util.tree_leaves(c)


@both
def test_setattr_of_a_field_default_is_not_a_method(lib):
    def scale(x):
        return 2 * x

    class S(lib.Module):
        fn: object = lib.field(static=True, default=scale)

        def __call__(self, x):
            return self.fn(x)

    def triple(x):
        return 3 * x

    assert S()(1) == 2
    S.fn = triple  # a new default for the field, not a method
    assert S.fn is triple


@both
def test_abstract_method_filled_by_a_subclass_hook(lib):
    class D(lib.Module):
        @abc.abstractmethod
        def f(self): ...

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            if cls.__dict__.get("fill"):
                cls.f = lambda self: "filled"

    class E(D):
        fill = True

    class Unfilled(D):
        pass

    assert E().f() == "filled"
    with pytest.raises(TypeError, match="abstract"):
        Unfilled()


@both
def test_properties_classmethods_staticmethods_replaced_by_a_hook(lib):
    class F(lib.Module):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            cls.p = property(lambda self: "new property")
            cls.c = classmethod(lambda k: ("classmethod", k.__name__))
            cls.s = staticmethod(lambda: "staticmethod")

    class G(F):
        @property
        def p(self):
            return "old"

        @classmethod
        def c(cls):
            return "old"

        @staticmethod
        def s():
            return "old"

    g = G()
    assert g.p == "new property"
    assert G.c() == ("classmethod", "G") and g.c() == ("classmethod", "G")
    assert G.s() == "staticmethod" and g.s() == "staticmethod"


@both
def test_metaclass_hook_wrapping_after_creation(lib):
    class Meta(type(lib.Module)):
        def __new__(mcs, name, bases, namespace, **kwargs):
            cls = super().__new__(mcs, name, bases, namespace, **kwargs)
            if "f" in cls.__dict__:
                # what the class holds now: on boxwood its method descriptor,
                # which calls as the function does
                cls.f = tagged(cls.__dict__["f"])
            return cls

    class H(lib.Module, metaclass=Meta):
        def f(self, x):
            return x

    assert H().f(1) == ("wrapped", 1)


@both
def test_wrapper_that_is_not_a_function_stays_as_python_binds_it(lib):
    class Caller:
        def __call__(self, *args):
            return ("object", len(args))

    class Base(lib.Module):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            cls.f = Caller()  # no `__get__`: not bound, as in Python

    class K(Base):
        def f(self):
            return "old"

    assert K().f() == ("object", 0)


def test_flowjax_pattern_unwraps_before_the_method_runs():
    """The shape of flowjax's bijections: a base class's hook wraps each
    subclass's methods so that parameters are unwrapped before they run."""

    class Wrapped(bw.Module):
        value: jax.Array

        def unwrap(self):
            return jnp.exp(self.value)

    def unwrapping(method):
        @functools.wraps(method)
        def run(self, x):
            fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            plain = {
                k: v.unwrap() if isinstance(v, Wrapped) else v
                for k, v in fields.items()
            }
            return method(type(self)(**plain), x)

        return run

    class Bijection(bw.Module):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            if "transform" in cls.__dict__:
                cls.transform = unwrapping(cls.__dict__["transform"])

    class Scale(Bijection):
        scale: jax.Array | Wrapped

        def transform(self, x):
            return x / self.scale

    s = Scale(Wrapped(jnp.log(jnp.array([2.0, 4.0]))))
    assert s.transform(jnp.ones(2)).tolist() == [0.5, 0.25]
    batched = jax.vmap(s.transform)(jnp.ones((3, 2)))
    assert batched.shape == (3, 2)


def test_method_descriptor_copies_without_recursion():
    import copy

    class M(bw.Module):
        def f(self):
            return 1

    descriptor = M.__dict__["f"]
    assert copy.copy(descriptor).func is M.f
    assert copy.deepcopy(descriptor).func is M.f
    bare = type(descriptor).__new__(type(descriptor))
    with pytest.raises(AttributeError, match="__name__"):
        bare.__name__  # noqa: B018


def _internals(lib):
    """The two internal names libraries that build modules themselves (quax)
    import from `equinox._module._module`."""
    module = bw._module._module if lib is bw else eqx._module._module
    return module._currently_initialising, module.is_abstract_module


@both
def test_is_abstract_module_as_on_equinox(lib):
    _, is_abstract_module = _internals(lib)

    class Method(lib.Module):
        @abc.abstractmethod
        def f(self): ...

    class MethodDone(Method):
        def f(self):
            return 1

    class Var(lib.Module):
        x: lib.AbstractVar[int]

    class VarDone(Var):
        x: int = 1

    class ClassVar(lib.Module):
        y: lib.AbstractClassVar[int]

    class Declared(lib.Module, is_abstract=True):
        pass

    class DeclaredChild(Declared):
        pass

    abstract = [Method, Var, ClassVar, Declared]
    concrete = [MethodDone, VarDone, DeclaredChild, lib.Module]
    assert [is_abstract_module(k) for k in abstract] == [True] * 4
    assert [is_abstract_module(k) for k in concrete] == [False] * 4


@both
def test_a_module_built_without_calling_its_class(lib):
    """quax's fast construction: `__new__`, then `__init__` inside the init guard,
    then the converters and checks by hand. The module flattens as one built by
    calling its class (its treedef too: static key included)."""
    guard, _ = _internals(lib)

    class Scaled(lib.Module):
        w: jax.Array
        scale: float = lib.field(static=True)

        def __init__(self, w, scale):
            self.w = w
            self.scale = scale

    def fast(cls, *args):
        self = cls.__new__(cls)
        guard.add(self)
        try:
            cls.__init__(self, *args)
        finally:
            guard.remove(self)
        return self

    made = fast(Scaled, jnp.ones(2), 2.0)
    called = Scaled(jnp.ones(2), 2.0)
    assert jax.tree.structure(made) == jax.tree.structure(called)
    if lib is bw:  # boxwood's treedefs tell `2.0` from `2` (Equinox's do not)
        assert jax.tree.structure(made) != jax.tree.structure(Scaled(jnp.ones(2), 2))
    assert bool(lib.tree_equal(made, called))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.w = jnp.zeros(2)
    doubled = jax.jit(lambda m: jax.tree.map(lambda x: 2 * x, m))(made)
    assert doubled.scale == 2.0 and doubled.w.tolist() == [2.0, 2.0]


@both
def test_a_metaclass_with_its_own_call(lib):
    """A library's metaclass that defines `__call__` (quax's fast construction,
    a counting or caching metaclass) runs for calls of the class; JAX's rebuilds
    of its modules do not reach it."""
    calls = []

    class CountingMeta(type(lib.Module)):
        def __call__(cls, *args, **kwargs):
            calls.append(cls.__name__)
            return super().__call__(*args, **kwargs)

    class Counted(lib.Module, metaclass=CountingMeta):
        w: jax.Array
        n: int = lib.field(static=True, default=3)

    c = Counted(jnp.ones(2))
    assert calls == ["Counted"]
    doubled = jax.tree.map(lambda x: 2 * x, c)
    traced = jax.jit(lambda m: m)(c)
    assert calls == ["Counted"]
    assert doubled.w.tolist() == [2.0, 2.0] and doubled.n == 3
    assert traced.n == 3 and bool(lib.tree_equal(traced, c))
