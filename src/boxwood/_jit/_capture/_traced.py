"""The function as the compiled core sees it, and the captured values in messages."""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any

import jax

from .._explain import describe_call
from ._rebuild import DESCRIBED, Capture


class Traced:
    """`fun` as the compiled core sees it: `(hidden, *args, **kwargs)`, rebuilt
    around the hidden captured values on each trace. It carries `fun`'s name and code
    so that diagnostics about the wrapped function name the user's function."""

    def __init__(self, fun: types.FunctionType, capture: Capture | None) -> None:
        self.capture = capture or Capture(fun)
        self.__code__ = fun.__code__
        self.__name__ = fun.__name__
        self.__qualname__ = fun.__qualname__
        self.__module__ = fun.__module__
        self.__doc__ = fun.__doc__

    @property
    def function(self) -> types.FunctionType | None:
        """The user's function (`None` once it is gone)."""
        return self.capture._fun()

    def __call__(self, hidden: tuple | None, *args: Any, **kwargs: Any) -> Any:
        capture = self.capture
        rebuilt = capture.rebuild(hidden)
        try:
            return rebuilt(*args, **kwargs)
        finally:
            capture.write_back(rebuilt.__globals__)


_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TRACED_LOCK = threading.Lock()


def traced_for(
    fun: types.FunctionType, variant: Any = None, fresh: bool = False
) -> Traced:
    """The `Traced` of `fun` for one calling convention `variant` (its code is
    scanned once; wrappers of the same function with the same convention share
    compiled code, as they do without captures). Held weakly by `fun`: it goes
    when the function does. `fresh`: scan again (a helper was defined since), and
    give the new scan to later wrappers."""
    with _TRACED_LOCK:
        variants = _TRACED.get(fun)
        if variants is None:
            variants = _TRACED[fun] = {}
        if fresh:
            variants.clear()
        traced = variants.get(variant)
        if traced is None:
            first = next(iter(variants.values()), None)
            traced = variants[variant] = Traced(fun, first and first.capture)
        return traced


def captured_path(keys: tuple, labels: list[str]) -> str:
    """`global 'model'.layers[0].weight` for the key path below the hidden tuple."""
    index, *rest = keys
    return labels[index.idx] + jax.tree_util.keystr(tuple(rest))


def describe_captures(hidden: Any, labels: list[str]) -> dict[str, tuple[str, str]]:
    """`_explain.describe_call` for the captured values, under their labels, and
    the trace-time constants of the hidden argument's static name
    (`global 'LR': 0.1`)."""
    out = {}
    static = hidden
    if type(hidden) is tuple:
        for label, value in zip(labels, hidden):
            if value is not None:
                for path, text in describe_call((value,), {}).items():
                    out[label + path.removeprefix("args[0]")] = text
        static = hidden[-1] if len(hidden) > len(labels) else None
    texts = DESCRIBED.get(static, {}) if type(static) is str else None
    if texts is None:  # the first constants (`Capture._static_name`)
        texts = getattr(labels, "first", {})
    for label, text in texts.items():
        out[label] = ("field", text)
    return out
