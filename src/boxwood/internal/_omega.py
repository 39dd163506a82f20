"""`ω`: arithmetic on whole pytrees, leaf by leaf."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax

_SCALARS = (bool, int, float, complex, jax.Array)


class _OmegaMeta(type):
    def __rpow__(cls, value: Any) -> Any:  # `tree**ω` is `ω(tree)`
        return cls(value)


class ω(metaclass=_OmegaMeta):  # noqa: N801 (Equinox's name)
    """Leaf-by-leaf arithmetic on pytrees: `(ω(a) + ω(b)).ω` is
    `jax.tree_util.tree_map(operator.add, a, b)`; `a**ω` is short for `ω(a)`.

    Supports the arithmetic, bitwise and comparison operators (with another `ω` of
    the same structure, or with a scalar or array applied to every leaf), unary
    `-`, `+`, `abs`, `~`, indexing `ω(a)[i]`, `.call(fn)`, and `ω(a).at[i].set(v)`
    (also `add`, `multiply`, `divide`, `power`, `min`, `max`).

    >>> import jax.numpy as jnp
    >>> from boxwood.internal import ω
    >>> a = {"x": jnp.array(1.0), "y": jnp.array(2.0)}
    >>> (a**ω * 2 + a**ω).ω
    {'x': Array(3., dtype=float32, weak_type=True), 'y': Array(6., dtype=float32, weak_type=True)}
    """

    def __init__(self, value: Any, is_leaf: Callable[[Any], bool] | None = None):
        self.ω = value
        self.is_leaf = is_leaf

    def __repr__(self) -> str:
        return f"ω({self.ω!r})"

    def _map(self, fn: Callable, *others: Any) -> ω:
        return ω(jax.tree_util.tree_map(fn, self.ω, *others, is_leaf=self.is_leaf),
                 is_leaf=self.is_leaf)  # fmt: skip

    def __getitem__(self, item: Any) -> ω:
        return self._map(lambda x: x[item])

    def call(self, fn: Callable) -> ω:
        """`fn` applied to every leaf."""
        return self._map(fn)

    @property
    def at(self) -> _At:
        """`ω(a).at[i].set(v)`: the indexed update on every leaf."""
        return _At(self)


def _same_is_leaf(a: Callable | None, b: Callable | None) -> bool:
    """Whether two `is_leaf`s are the same: one object, or functions of the same
    code (two equal lambdas), as Equinox checks."""
    if a is b:
        return True
    ca, cb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if ca is None or cb is None:
        return False
    return (ca.co_code, ca.co_names, ca.co_consts) == (
        cb.co_code,
        cb.co_names,
        cb.co_consts,
    )


def _binary_operand(
    self: ω, other: Any, op_name: str, reflected: bool = False
) -> Callable[[Callable], ω]:
    """`op_name`: the operator as written (`+`, `.at[].set`); `reflected`: `ω` is
    on its right (`2 * ω(a)`), as the messages show it."""
    if isinstance(other, ω):
        if not _same_is_leaf(self.is_leaf, other.is_leaf):
            raise ValueError(
                f"`ω {op_name} ω` needs the same `is_leaf` on both sides (got "
                f"{self.is_leaf!r} and {other.is_leaf!r}): pass the same one to both."
            )
        mine = jax.tree_util.tree_structure(self.ω, is_leaf=self.is_leaf)
        theirs = jax.tree_util.tree_structure(other.ω, is_leaf=self.is_leaf)
        if mine != theirs:
            raise ValueError(
                f"`ω {op_name} ω` needs pytrees of the same structure; got {mine} "
                f"and {theirs}."
            )
        return lambda op: self._map(op, other.ω)
    if isinstance(other, _SCALARS):
        return lambda op: self._map(lambda x: op(x, other))
    if reflected:
        raise TypeError(
            f"`... {op_name} ω` takes another `ω`, a scalar or an array; got "
            f"{type(other).__name__}."
        )
    raise TypeError(
        f"`ω {op_name} ...` takes another `ω`, a scalar or an array; got "
        f"{type(other).__name__}."
    )


def _install_binary(name: str, op: Callable, symbol: str, reflected: bool) -> None:
    def method(self: ω, other: Any) -> ω:
        return _binary_operand(self, other, symbol, reflected)(op)

    method.__name__ = name
    setattr(ω, name, method)


def _flip(op: Callable) -> Callable:
    return lambda x, y: op(y, x)


# name -> (operator, symbol)
_BINARY = {
    "add": (operator.add, "+"), "sub": (operator.sub, "-"),
    "mul": (operator.mul, "*"), "matmul": (operator.matmul, "@"),
    "truediv": (operator.truediv, "/"), "floordiv": (operator.floordiv, "//"),
    "mod": (operator.mod, "%"), "pow": (operator.pow, "**"),
    "lshift": (operator.lshift, "<<"), "rshift": (operator.rshift, ">>"),
    "and": (operator.and_, "&"), "xor": (operator.xor, "^"), "or": (operator.or_, "|"),
}  # fmt: skip
for _name, (_op, _symbol) in _BINARY.items():
    _install_binary(f"__{_name}__", _op, _symbol, reflected=False)
    _install_binary(f"__r{_name}__", _flip(_op), _symbol, reflected=True)
for _name, _symbol in (("lt", "<"), ("le", "<="), ("eq", "=="), ("ne", "!="),
                       ("gt", ">"), ("ge", ">=")):  # fmt: skip
    _install_binary(f"__{_name}__", getattr(operator, _name), _symbol, False)
for _name, _op in (("__neg__", operator.neg), ("__pos__", operator.pos),
                   ("__abs__", operator.abs), ("__invert__", operator.invert)):  # fmt: skip
    setattr(ω, _name, lambda self, _op=_op: self._map(_op))
# unhashable on purpose: `==` is leaf by leaf
ω.__hash__ = None  # pyright: ignore[reportAttributeAccessIssue]


class _At:
    __slots__ = ("base",)

    def __init__(self, base: ω):
        self.base = base

    def __getitem__(self, index: Any) -> _AtIndex:
        return _AtIndex(self.base, index)


class _AtIndex:
    __slots__ = ("base", "index")

    def __init__(self, base: ω, index: Any):
        self.base, self.index = base, index


def _install_update(method: str) -> None:
    def update(self: _AtIndex, other: Any, **kwargs: Any) -> ω:
        def op(x: Any, y: Any) -> Any:
            return getattr(x.at[self.index], method)(y, **kwargs)

        return _binary_operand(self.base, other, f".at[].{method}")(op)

    update.__name__ = method
    setattr(_AtIndex, method, update)


for _method in ("set", "add", "multiply", "divide", "power", "min", "max"):
    _install_update(_method)
