"""`doc_repr` and `doc_remove_args`: how objects look in generated documentation.

Both only act while documentation is being generated (when the documentation tool
sets `typing.GENERATING_DOCUMENTATION`); otherwise they return their argument.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def _documenting() -> bool:
    return hasattr(typing, "GENERATING_DOCUMENTATION")


class _Labelled:
    """Stands for `target` in generated documentation: shown as `label`, and
    otherwise behaving like `target` (calls and attributes go through to it). It
    is callable, so `typing` accepts it inside annotations, and `|` builds a
    `typing.Union` with it."""

    __slots__ = ("target", "label")

    def __init__(self, target: Any, label: str) -> None:
        self.target, self.label = target, label

    def __repr__(self) -> str:
        return self.label

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.target(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def __or__(self, other: Any) -> Any:
        return typing.Union[self, other]  # noqa: UP007 (`self` is not a type)

    def __ror__(self, other: Any) -> Any:
        return typing.Union[other, self]  # noqa: UP007


def doc_repr(obj: _T, string: str) -> _T:
    """`obj`, shown as `string` in generated documentation (for a default value
    whose repr is unhelpful, say)."""
    return _Labelled(obj, string) if _documenting() else obj  # pyright: ignore[reportReturnType]


def doc_remove_args(*args: str) -> Callable[[_T], _T]:
    """Decorator hiding the parameters named `args` from the signature shown in
    generated documentation."""
    hidden = frozenset(args)

    def hide(fn: Any) -> Any:
        if not _documenting():
            return fn
        signature = inspect.signature(fn)
        shown = [p for name, p in signature.parameters.items() if name not in hidden]
        # `object.__setattr__`: `fn` may be a frozen callable (a module, say)
        object.__setattr__(fn, "__signature__", signature.replace(parameters=shown))
        return fn

    return hide
