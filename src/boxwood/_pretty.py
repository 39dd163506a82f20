"""Readable text for pytrees: `tree_pformat`, `tree_pprint` and `Module.__repr__`."""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

_DTYPE_SHORT = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "complex64": "c64", "complex128": "c128", "bool": "bool",
}  # fmt: skip


def array_summary(x: Any) -> str:
    """`f32[4,3]`-style summary of an array (NumPy arrays get a `(numpy)` suffix)."""
    dtype = _DTYPE_SHORT.get(str(x.dtype), str(x.dtype))
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        dtype = "key<" + str(jax.random.key_impl(x)) + ">"
    text = f"{dtype}[{','.join(str(d) for d in x.shape)}]"
    if isinstance(x, (np.ndarray, np.generic)):
        text += "(numpy)"
    return text


def _short_array(x: Any) -> str:
    """`array_summary`, with Equinox's `weak_` prefix for weakly typed JAX values."""
    text = array_summary(x)
    if not isinstance(x, np.ndarray | np.generic) and getattr(x, "weak_type", False):
        text = "weak_" + text
    return text


def _function_text(x: Any) -> str:
    name = getattr(x, "__qualname__", None) or x.__name__
    if isinstance(x, types.BuiltinFunctionType):
        return f"<built-in function {name}>"
    if hasattr(x, "__wrapped__"):  # `functools.wraps`
        return f"<wrapped function {name}>"
    return f"<function {name}>"


def _leaf_text(x: Any, short_arrays: bool) -> str:
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        if short_arrays or isinstance(x, jax.core.Tracer):
            return _short_array(x)
        return repr(x)
    if isinstance(x, functools.partial):
        parts = [_leaf_text(x.func, short_arrays)]
        parts += [_leaf_text(a, short_arrays) for a in x.args]
        parts += [f"{k}={_leaf_text(v, short_arrays)}" for k, v in x.keywords.items()]
        return f"partial({', '.join(parts)})"
    if isinstance(x, (types.FunctionType, types.BuiltinFunctionType)):
        return _function_text(x)
    if hasattr(x, "_boxwood_jit"):  # a `filter_jit` function (a C callable, or not)
        return f"<function {x.__qualname__}>"
    if isinstance(x, jax.custom_jvp) or isinstance(x, jax.custom_vjp):
        return f"<function {getattr(x.fun, '__name__', repr(x.fun))}>"
    return repr(x)


def _block(open_: str, items: list[str], close: str, width: int, indent: int) -> str:
    flat = open_ + ", ".join(items) + close
    if "\n" not in flat and len(flat) <= width:
        return flat
    pad = " " * indent
    body = "".join(pad + item.replace("\n", "\n" + pad) + ",\n" for item in items)
    return f"{open_}\n{body}{close}"


def _never(x: Any) -> bool:
    return False


def _format(
    x: Any, width: int, indent: int, short: bool, struct: bool = False,
    truncate: Callable[[Any], bool] = _never,
) -> str:  # fmt: skip
    fmt = functools.partial(
        _format, width=width - indent, indent=indent, short=short, struct=struct,
        truncate=truncate,
    )  # fmt: skip
    if truncate(x):
        return f"{type(x).__name__}(...)"
    if struct and isinstance(x, jax.ShapeDtypeStruct):
        return _short_array(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        items = [
            f"{f.name}={fmt(getattr(x, f.name, '<unset>'))}"
            for f in dataclasses.fields(x)
            if f.repr
        ]
        return _block(f"{type(x).__name__}(", items, ")", width, indent)
    fields = getattr(x, "_fields", None)
    if isinstance(x, tuple) and fields is not None:  # namedtuple
        items = [f"{k}={fmt(v)}" for k, v in zip(fields, x)]
        return _block(f"{type(x).__name__}(", items, ")", width, indent)
    if isinstance(x, list):
        return _block("[", [fmt(v) for v in x], "]", width, indent)
    if isinstance(x, tuple):
        if len(x) == 1:
            return f"({fmt(x[0])},)"
        return _block("(", [fmt(v) for v in x], ")", width, indent)
    if isinstance(x, dict):
        items = [f"{k!r}: {fmt(v)}" for k, v in x.items()]
        return _block("{", items, "}", width, indent)
    return _leaf_text(x, short)


def tree_pformat(
    pytree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = False,
    truncate_leaf: Callable[[Any], bool] = _never,
) -> str:
    """Format a pytree as readable, indented text, summarising arrays as `f32[4,3]`.

    **Arguments:**

    - `pytree`: what to format: modules, lists, tuples, dicts, arrays, anything.
    - `width`: lines longer than this are broken up.
    - `indent`: spaces per nesting level.
    - `short_arrays`: `False` prints arrays' values in full.
    - `struct_as_array`: print `jax.ShapeDtypeStruct`s as arrays (`f32[4,3]`).
    - `truncate_leaf`: `node -> bool`; nodes for which it is true (any node, not
      only leaves) print as `TypeName(...)`.

    **Returns:**

    The text.

    >>> import boxwood, jax.numpy as jnp
    >>> print(boxwood.tree_pformat({"w": jnp.zeros((4, 3)), "act": "relu"}))
    {'w': f32[4,3], 'act': 'relu'}
    >>> print(boxwood.tree_pformat([[1, 2], (3,)], truncate_leaf=lambda n: n == [1, 2]))
    [list(...), (3,)]
    """
    return _format(pytree, width, indent, short_arrays, struct_as_array, truncate_leaf)


def tree_pprint(
    pytree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = False,
    truncate_leaf: Callable[[Any], bool] = _never,
) -> None:
    """Print [`boxwood.tree_pformat`][]'s text (same arguments)."""
    text = tree_pformat(
        pytree, width=width, indent=indent, short_arrays=short_arrays,
        struct_as_array=struct_as_array, truncate_leaf=truncate_leaf,
    )  # fmt: skip
    print(text)
