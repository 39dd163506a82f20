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


class _Shown(type):
    """A class standing in for `obj` whose repr is `text`; calling it calls `obj`.
    (A class, so that it may appear inside type annotations too.)"""

    obj: Any
    text: str

    def __new__(mcs, obj: Any, text: str) -> Any:
        cls = super().__new__(mcs, text, (), {"obj": obj, "text": text})
        cls.__module__ = "builtins"
        return cls

    def __init__(cls, obj: Any, text: str) -> None:
        pass

    def __repr__(cls) -> str:
        return cls.text

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.obj(*args, **kwargs)


def doc_repr(obj: _T, string: str) -> _T:
    """`obj`, shown as `string` in generated documentation (for a default value
    whose repr is unhelpful, say)."""
    return _Shown(obj, string) if _documenting() else obj  # type: ignore[return-value]


def doc_remove_args(*args: str) -> Callable[[_T], _T]:
    """Decorator hiding the parameters named `args` from the signature shown in
    generated documentation."""

    def hide(fn: Any) -> Any:
        if _documenting():
            sig = inspect.signature(fn)
            kept = [p for p in sig.parameters.values() if p.name not in args]
            object.__setattr__(fn, "__signature__", sig.replace(parameters=kept))
        return fn

    return hide
