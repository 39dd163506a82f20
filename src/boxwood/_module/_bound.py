"""Bound methods of modules, as pytrees.

Reading a method on a module instance (`model.__call__`, `model.encode`) gives a
`BoundMethod` (see `_module._Method`): a module whose dynamic field is the instance
and whose static field is the function. Its leaves are the module's, so it can be
passed to `jax.jit`, `filter_jit`, `tree_leaves`, ... as the module itself can, and
the bound methods of two modules with the same structure share compiled code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import _module as _core
from ._field import field
from ._module import Module, set_dict
from ._register import REBUILD_NAME
from ._static_key import StaticKey


class BoundMethod(Module):
    """`instance.func` as a pytree: `instance` is a child, `func` is static."""

    _boxwood_plain_methods = True  # its own `__call__` stays a plain function

    func: Callable = field(static=True)
    instance: Any

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(self.instance, *args, **kwargs)

    @property
    def __self__(self) -> Any:
        return self.instance

    @property
    def __func__(self) -> Callable:
        return self.func

    @property
    def __wrapped__(self) -> Callable:
        return self.func.__get__(self.instance, type(self.instance))

    @property
    def __name__(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__wrapped__)


_new = object.__new__
_KEY = StaticKey((BoundMethod, None))  # `_static_key.key` of any bound function


def _bind(func: Callable, obj: Any) -> BoundMethod:
    bound = _new(BoundMethod)
    set_dict(
        bound,
        {"func": func, "instance": obj, REBUILD_NAME: _KEY},
    )
    return bound


_core.bind_method = _bind
