"""What a captured value is: an input (it holds arrays) or a trace-time constant,
and how values are named in messages."""

from __future__ import annotations

import functools
import types
from typing import Any

import jax

from ..._filters import is_array
from ..._module import Module

MISSING = object()  # a name not (yet) bound
_PLAIN = frozenset(
    {int, float, bool, complex, str, bytes, type(None), type, types.FunctionType,
     types.BuiltinFunctionType, types.MethodType, types.ModuleType}
)  # fmt: skip


class CapturedValueWarning(UserWarning):
    """A value read by a `filter_jit` function from its globals or closure has
    changed since the function was traced, and the compiled code still uses the old
    value: a number, string or other non-array value, or an array read where
    boxwood cannot pass it as an input (inside a method)."""


MSG_CHANGED = (
    "{label} changed from {old} to {new} since {name} was compiled; it is baked in "
    "at trace time. Pass it as an argument (or as an array, to trace it), or call "
    "`clear_cache()` on the compiled function to trace again with the new value."
)
MSG_UNFOLLOWED = (
    "{label} changed from {old} to {new} since {name} was compiled, but it is read "
    "inside {via}, which boxwood cannot pass it to (a method, a class attribute, or "
    "the function of a callable object given to `filter_jit`): the compiled code "
    "still uses the old value. Pass it as an argument (or store it in a field of "
    "the module), or call `clear_cache()` on the compiled function to trace again "
    "with the new value."
)
MSG_FIXED_READ = (
    "{label} ({value}) is read inside {via}{where}: a method runs from its class (as "
    "does the function of a callable object given to `filter_jit`), so boxwood "
    "cannot pass that global to it as an input, and the compiled code keeps the "
    "value it has at this first trace; a later rebinding is not seen (it warns). "
    "Store it in a field of the module or pass it as an argument{fix}."
)
MSG_ARGUMENT_METHOD = (
    "{label} ({value}) is read inside {via}, a method of a module passed to {name}: "
    "a method runs from its class, so boxwood cannot pass that global to it as an "
    "input, and the compiled code keeps the value it has at this first trace; "
    "rebinding it later is not seen. Store it in a field of the module or pass it "
    "as an argument (or read it in {name} itself, where what the function reads "
    "from globals is an input)."
)


def global_label(name: str) -> str:
    return f"global {name!r}"


def closure_label(name: str) -> str:
    return f"closure {name!r}"


def contents(cell: types.CellType) -> Any:
    """A closure cell's value (`MISSING` when not assigned yet)."""
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING


def has_arrays(value: Any) -> bool:
    """Whether a captured value is an input (it holds arrays) rather than a
    trace-time constant.

    **Arguments:**

    - `value`: what a watched name is bound to.

    **Returns:** `True` for arrays, modules and pytrees with an array leaf.

    >>> import jax.numpy as jnp
    >>> has_arrays({"w": jnp.ones(2), "name": "a"}), has_arrays((0.1, "a"))
    (True, False)
    """
    if type(value) in _PLAIN:
        return False
    if is_array(value) or isinstance(value, Module):  # a module: no walk needed
        return True
    return any(map(is_array, jax.tree_util.tree_leaves(value)))


METHOD, PARTIAL = "method", "partial"


def split_callable(value: Any) -> tuple[tuple[str, Any], Any] | None:
    """`((kind, function), part)` for a callable whose data holds arrays: a bound
    method of a module or other pytree (`part`: the object) or a `functools.partial`
    (`part`: `(args, keywords)`). The part is an input, traced like a captured
    module; the function is fixed (part of the cache key). `None` for anything
    else."""
    typ = type(value)
    if typ is types.MethodType:
        obj = value.__self__
        if not isinstance(obj, type) and has_arrays(obj):
            return (METHOD, value.__func__), obj
    elif typ is functools.partial:
        part = (value.args, value.keywords)
        if has_arrays(part):
            return (PARTIAL, value.func), part
    return None


def is_input(value: Any) -> bool:
    """Whether a captured value is passed to the compiled code (it holds arrays)."""
    return has_arrays(value) or split_callable(value) is not None


def join_callable(kind: str, func: Any, part: Any) -> Any:
    if kind == METHOD:
        return types.MethodType(func, part)
    args, keywords = part
    return functools.partial(func, *args, **keywords)


def equal(a: Any, b: Any) -> bool:
    if is_array(a) or is_array(b):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # e.g. an ambiguous truth value: treat as changed
        return False


def short(x: Any, old: Any = MISSING) -> str:
    """`x` for a message; `old`, when given, is the value `x` replaced: if the two
    print alike (a class or function defined again, as a re-run notebook cell does),
    the text says that `x` is a new object."""
    if x is MISSING:
        text = "unbound"
    elif is_array(x):
        text = f"an array {getattr(x.dtype, 'name', x.dtype)}{list(x.shape)}"
    else:
        text = repr(x)
    text = text if len(text) <= 60 else text[:57] + "..."
    if (
        old is not MISSING
        and x is not MISSING
        and short(old) == text
        and not is_array(x)
    ):
        text += " (a new object with the same name: a class or function defined again?)"
    return text
