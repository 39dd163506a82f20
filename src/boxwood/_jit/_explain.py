"""Recompile explanations: what changed between two calls, in the caller's own names.

At trace time `describe_call` turns the (traced) arguments into a flat mapping from
paths (`args[0].layers[1].inference`, `kwargs['x']`) to short descriptions of what
decides compilation there: a node's type and static fields, an array's
shape/dtype, a non-array leaf's value. Only strings are kept, never arrays, so the
record holds no references to the caller's data. `explain` diffs a new description
against the closest recorded one.
"""

from __future__ import annotations

import sys
from typing import Any

import jax

from .._filters import is_array
from .._module import Module
from .._pretty import array_summary

_PY_SCALARS = (bool, int, float, complex)
_MAX_REPR = 60


def _value_text(x: Any) -> str:
    if isinstance(x, _PY_SCALARS):
        return f"Python {type(x).__name__} {x!r}"
    return _short_repr(x)


def _short_repr(x: Any) -> str:
    text = repr(x)
    if len(text) > _MAX_REPR:
        text = text[: _MAX_REPR - 3] + "..."
    return text


def _array_text(x: Any) -> str:
    text = array_summary(x)
    aval = getattr(x, "aval", None)
    if getattr(aval, "weak_type", False) or getattr(x, "weak_type", False):
        text += "(weak)"
    return text


def _describe(x: Any, path: str, out: dict[str, tuple[str, str]]) -> None:
    if isinstance(x, Module):
        cls: Any = type(x)
        out[path] = ("node", cls.__qualname__)
        for f in cls._boxwood_fields:
            if f.name in cls._boxwood_static:
                out[f"{path}.{f.name}"] = ("field", _short_repr(getattr(x, f.name)))
            else:
                _describe(getattr(x, f.name), f"{path}.{f.name}", out)
        return
    if is_array(x):
        out[path] = ("array", _array_text(x))
        return
    keyed, node = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if jax.tree_util.treedef_is_leaf(node) and node.num_leaves == 1:
        out[path] = ("static", _value_text(x))
        return
    out[path] = ("node", str(node).removeprefix("PyTreeDef(").removesuffix(")"))
    for keys, child in keyed:
        _describe(child, path + jax.tree_util.keystr(keys), out)


def describe_call(args: tuple, kwargs: dict) -> dict[str, tuple[str, str]]:
    """Paths of a call's arguments -> (kind, description), where kind is "node" (a
    pytree node's type), "field" (a module's static field), "array" or "static" (a
    non-array leaf)."""
    out: dict[str, tuple[str, str]] = {}
    for i, a in enumerate(args):
        _describe(a, f"args[{i}]", out)
    for k, v in kwargs.items():
        _describe(v, f"kwargs[{k!r}]", out)
    return out


_STATIC_HINT = " (non-array leaves are static; pass jnp.asarray(...) to trace it)"


def _line(path: str, old: tuple[str, str] | None, new: tuple[str, str] | None) -> str:
    if old is None:
        return f"{path}: new argument {new[1] if new else ''}"
    if new is None:
        return f"{path}: argument removed (was {old[1]})"
    if old[0] == "node" or new[0] == "node":
        return f"{path}: structure changed: {old[1]} -> {new[1]}"
    hint = _STATIC_HINT if new[0] == "static" else ""
    return f"{path}: {old[1]} -> {new[1]}{hint}"


def _is_under(path: str, parent: str) -> bool:
    return path.startswith(parent) and path[len(parent)] in ".["


def diff(old: dict, new: dict) -> list[str]:
    """Human-readable differences between two descriptions (outermost first)."""
    lines: list[str] = []
    skip: list[str] = []
    paths = list(new) + [p for p in old if p not in new]
    for path in paths:
        if any(len(path) > len(s) and _is_under(path, s) for s in skip):
            continue
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        lines.append(_line(path, a, b))
        if a is None or b is None or "node" in (a[0], b[0]):
            skip.append(path)
    return lines


def explain(previous: list[dict], new: dict) -> list[str]:
    """Differences between `new` and the closest of the `previous` descriptions
    (the latest of equally close ones: a value changed twice is explained by its
    last change, `0.0 -> 1.0`, not its first)."""
    best: list[str] | None = None
    for old in reversed(previous):
        lines = diff(old, new)
        if best is None or len(lines) < len(best):
            best = lines
    return best or []


NOTE_AT = 3  # the compile of one function that prints a note under IPython


def in_ipython() -> bool:
    """Whether an IPython shell (a Jupyter kernel, the IPython terminal) runs."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    try:
        return callable(get) and get() is not None
    except Exception:  # an IPython that cannot say: no note
        return False


def note(name: str, lines: list[str]) -> None:
    """Print the one-line note of a function's third compile (`lines`: what
    changed, from `explain`)."""
    changes = "; ".join(line.strip() for line in lines)
    print(
        f"boxwood: filter_jit({name}) compiled for the {NOTE_AT}rd time: {changes} "
        "(`boxwood.config.recompile_notes = False` silences this)"
    )
