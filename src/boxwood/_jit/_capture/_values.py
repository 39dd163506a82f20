"""What a captured value is: an input (it holds arrays) or a trace-time constant,
and how values are named in messages."""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any

import jax

from ..._filters import is_array
from ..._module import Module

MISSING = object()  # a name not (yet) bound
_PLAIN = frozenset(
    {int, float, bool, complex, str, bytes, type(None), type, types.FunctionType,
     types.BuiltinFunctionType, types.MethodType, types.ModuleType}
)  # fmt: skip


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


def foreign_label(g: dict, name: str) -> str:
    """A global of another file (that of a module argument's class):
    `global 'layers.SCALE'`."""
    return global_label(f"{g.get('__name__', '?')}.{name}")


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


def join_callable(kind: str, func: Any, part: Any) -> Any:
    if kind == METHOD:
        return types.MethodType(func, part)
    args, keywords = part
    return functools.partial(func, *args, **keywords)


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


class Same:
    """An object in a cache key, equal only to itself (held weakly where it can be:
    a key never keeps an old value alive, and a dead one equals nothing)."""

    __slots__ = ("ref", "hash")

    def __init__(self, obj: Any) -> None:
        try:
            self.ref: Any = weakref.ref(obj)
        except TypeError:  # not weakly referenceable: held
            self.ref = lambda obj=obj: obj
        self.hash = id(obj)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Same:
            return False
        mine = self.ref()
        return mine is not None and mine is other.ref()

    def __hash__(self) -> int:
        return self.hash


_BY_VALUE = frozenset({int, bool, str, bytes, complex, type(None)})
_MAX_KEY_DEPTH = 8


def value_key(value: Any, depth: int = 0) -> Any:
    """The part of the cache key that stands for a trace-time constant: numbers,
    strings and tuples by value (`1`, `1.0` and `True` apart, `-0.0` apart from
    `0.0`), functions by identity and code (`__code__` replaced in place, as
    `%autoreload` does, is a change), classes by identity and the code of their
    methods, anything else by identity.

    **Arguments:**

    - `value`: what a watched name is bound to.

    >>> value_key(0.1) == value_key(0.1), value_key(1) == value_key(1.0)
    (True, False)
    """
    typ = type(value)
    if typ in _BY_VALUE:
        return (typ, value)
    if typ is float:  # the hex form tells -0.0 from 0.0, and nan equals itself
        return (float, value.hex())
    if isinstance(value, types.FunctionType):
        return (Same(value), value.__code__)
    if isinstance(value, tuple) and depth < _MAX_KEY_DEPTH:  # NamedTuples too
        return (typ, tuple(value_key(x, depth + 1) for x in value))
    if isinstance(value, type):
        return (Same(value), class_code(value))
    return Same(value)


def class_code(cls: type) -> tuple:
    """The code of the functions a class defines itself (its methods, static and
    class methods, property getters)."""
    out = []
    for item in vars(cls).values():
        item = getattr(item, "__func__", getattr(item, "fget", item))
        code = getattr(item, "__code__", None)
        if type(code) is types.CodeType:
            out.append(code)
    return tuple(out)


def describe_value(value: Any, definition: int) -> str:
    """`value` in a recompile explanation; `definition`: how many distinct objects
    the name has been bound to whose text would read the same (a function or class
    defined again), so that the two sides of a change differ."""
    if type(value) is types.FunctionType or isinstance(value, type):
        kind = "function" if type(value) is types.FunctionType else "class"
        text = f"{kind} {value.__qualname__}"
    else:
        text = short(value)
    return text if definition <= 1 else f"{text} (definition {definition})"
