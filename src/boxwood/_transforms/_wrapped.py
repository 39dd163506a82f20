"""`Wrapped`: the base class of the callables the filtered transformations return.

A wrapper is a module whose dynamic field is the wrapped function, so that the
wrapper of a bound method of a module (`filter_grad(model.loss)`) is itself a pytree
holding the module's arrays; its `__name__`, `__doc__`, `__qualname__` and
`__annotations__` are the wrapped function's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._module import BoundMethod, Module
from .._partial import Partial


def _named(fun: Callable) -> Callable:
    """The function whose name and docstring a wrapper of `fun` shows."""
    return fun.func if isinstance(fun, BoundMethod) else fun


class _Annotations(dict):
    """A wrapper class's own `__annotations__` (its fields', as the dataclass
    machinery and `typing.get_type_hints` read them) that, read on an instance,
    gives the annotations of the function it wraps."""

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return getattr(_named(instance.__wrapped__), "__annotations__", {})


def follow_wrapped_annotations(cls: type) -> None:
    """Make `instance.__annotations__` of the wrapper class `cls` (which has a
    `__wrapped__`) the wrapped function's."""
    own = cls.__dict__.get("__annotations__", {})
    type.__setattr__(cls, "__annotations__", _Annotations(own))


def wrapped_qualname(wrapper: Any) -> str:
    target = _named(wrapper.__wrapped__)
    return getattr(target, "__qualname__", type(target).__qualname__)


class Wrapped(Module):
    # Base class of the callables returned by the transformations.
    #
    # The wrapped function is a dynamic field, so a wrapped bound method of a module
    # (e.g. `filter_grad(model.loss)`) is itself a pytree holding the module's arrays.
    # `__wrapped__`, `__name__` and `__doc__` come from the wrapped function (what
    # `functools.wraps` would copy) and survive flattening and unflattening.
    # (No class docstrings here or in subclasses: `__doc__` is a property.)

    fun: Callable

    @property
    def __wrapped__(self) -> Callable:
        return self.fun

    @property
    def __name__(self) -> str:  # type: ignore[override]
        target = _named(self.fun)
        return getattr(target, "__name__", type(target).__name__)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return getattr(_named(self.fun), "__doc__", None)

    def __getattr__(self, name: str) -> Any:
        # `__qualname__` is not a class attribute of instances (a type's is a slot of
        # `type`), so it comes here; a property would have to be a `str`.
        if name == "__qualname__":
            return wrapped_qualname(self)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}"
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__doc__ = Wrapped.__dict__["__doc__"]  # a subclass docstring would hide it
        follow_wrapped_annotations(cls)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """Used as a method decorator, bind `instance` as the first argument."""
        if instance is None:
            return self
        return Partial(cast(Callable, self), instance)  # subclasses are callable


follow_wrapped_annotations(Wrapped)
