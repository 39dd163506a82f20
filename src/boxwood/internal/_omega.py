"""`ω`: arithmetic on whole pytrees, leaf by leaf."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import jax

_SCALARS = (bool, int, float, complex, jax.Array)
_UPDATES = frozenset({"set", "add", "multiply", "divide", "power", "min", "max"})


class _OmegaMeta(type):
    def __rpow__(cls, value: Any) -> Any:  # `tree**ω` is `ω(tree)`
        return cls(value)


def _code_of(fn: Callable | None) -> tuple | None:
    code = getattr(fn, "__code__", None)
    return None if code is None else (code.co_code, code.co_names, code.co_consts)


def _same_is_leaf(a: Callable | None, b: Callable | None) -> bool:
    """Whether two `is_leaf`s are the same: one object, or functions compiled from
    the same source (two lambdas written alike, say)."""
    return a is b or (_code_of(a) is not None and _code_of(a) == _code_of(b))


class _LeafOp:
    """An operator of `ω`, as a descriptor: `op` applied leaf by leaf, to one
    operand (`arity=1`) or two (`ω` on the left, or on the right if `reflected`)."""

    def __init__(
        self, op: Callable, symbol: str, *, reflected: bool = False, arity: int = 2
    ) -> None:
        self.op, self.symbol, self.reflected, self.arity = op, symbol, reflected, arity

    def __get__(self, instance: ω | None, owner: type) -> Any:
        if instance is None:
            return self
        return functools.partial(self.apply, instance)

    def apply(self, me: ω, *other: Any) -> ω:
        if self.arity == 1:
            return me._map(self.op)
        (value,) = other
        partner = _partner(me, value, self.symbol, self.reflected)
        if self.reflected:
            return me._map(lambda x, y: self.op(y, x), partner)
        return me._map(self.op, partner)


def _partner(me: ω, other: Any, symbol: str, reflected: bool = False) -> Any:
    """`other` as a pytree shaped like `me.ω`: another `ω`'s tree (checked to match),
    or a scalar or array placed at every leaf. `symbol`: the operator as written
    (`+`, `.at[].set`); `reflected`: `ω` is on its right (`2 * ω(a)`)."""
    if isinstance(other, ω):
        both = f"`ω {symbol} ω`"
        if not _same_is_leaf(me.is_leaf, other.is_leaf):
            raise ValueError(
                f"{both} needs the same `is_leaf` on both sides (got {me.is_leaf!r} "
                f"and {other.is_leaf!r}): pass the same one to both."
            )
        mine = jax.tree_util.tree_structure(me.ω, is_leaf=me.is_leaf)
        theirs = jax.tree_util.tree_structure(other.ω, is_leaf=me.is_leaf)
        if mine != theirs:
            raise ValueError(
                f"{both} needs pytrees of the same structure; got {mine} and {theirs}."
            )
        return other.ω
    if not isinstance(other, _SCALARS):
        spelled = f"`... {symbol} ω`" if reflected else f"`ω {symbol} ...`"
        raise TypeError(
            f"{spelled} takes another `ω`, a scalar or an array; got "
            f"{type(other).__name__}."
        )
    return jax.tree_util.tree_map(lambda _: other, me.ω, is_leaf=me.is_leaf)


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

    __hash__ = None  # pyright: ignore[reportAssignmentType]  # `==` is leaf by leaf

    def __init__(self, value: Any, is_leaf: Callable[[Any], bool] | None = None):
        self.ω = value
        self.is_leaf = is_leaf

    def __repr__(self) -> str:
        return f"ω({self.ω!r})"

    def _map(self, fn: Callable, *others: Any) -> ω:
        mapped = jax.tree_util.tree_map(fn, self.ω, *others, is_leaf=self.is_leaf)
        return ω(mapped, is_leaf=self.is_leaf)

    def __getitem__(self, item: Any) -> ω:
        return self._map(lambda x: x[item])

    def call(self, fn: Callable) -> ω:
        """`fn` applied to every leaf."""
        return self._map(fn)

    @property
    def at(self) -> _Update:
        """`ω(a).at[i].set(v)`: the indexed update on every leaf."""
        return _Update(self, None)

    __add__, __radd__ = _LeafOp(operator.add, "+"), _LeafOp(operator.add, "+", reflected=True)  # fmt: skip
    __sub__, __rsub__ = _LeafOp(operator.sub, "-"), _LeafOp(operator.sub, "-", reflected=True)  # fmt: skip
    __mul__, __rmul__ = _LeafOp(operator.mul, "*"), _LeafOp(operator.mul, "*", reflected=True)  # fmt: skip
    __matmul__, __rmatmul__ = _LeafOp(operator.matmul, "@"), _LeafOp(operator.matmul, "@", reflected=True)  # fmt: skip
    __truediv__, __rtruediv__ = _LeafOp(operator.truediv, "/"), _LeafOp(operator.truediv, "/", reflected=True)  # fmt: skip
    __floordiv__, __rfloordiv__ = _LeafOp(operator.floordiv, "//"), _LeafOp(operator.floordiv, "//", reflected=True)  # fmt: skip
    __mod__, __rmod__ = _LeafOp(operator.mod, "%"), _LeafOp(operator.mod, "%", reflected=True)  # fmt: skip
    __pow__, __rpow__ = _LeafOp(operator.pow, "**"), _LeafOp(operator.pow, "**", reflected=True)  # fmt: skip
    __lshift__, __rlshift__ = _LeafOp(operator.lshift, "<<"), _LeafOp(operator.lshift, "<<", reflected=True)  # fmt: skip
    __rshift__, __rrshift__ = _LeafOp(operator.rshift, ">>"), _LeafOp(operator.rshift, ">>", reflected=True)  # fmt: skip
    __and__, __rand__ = _LeafOp(operator.and_, "&"), _LeafOp(operator.and_, "&", reflected=True)  # fmt: skip
    __xor__, __rxor__ = _LeafOp(operator.xor, "^"), _LeafOp(operator.xor, "^", reflected=True)  # fmt: skip
    __or__, __ror__ = _LeafOp(operator.or_, "|"), _LeafOp(operator.or_, "|", reflected=True)  # fmt: skip
    __lt__, __le__ = _LeafOp(operator.lt, "<"), _LeafOp(operator.le, "<=")
    __eq__, __ne__ = _LeafOp(operator.eq, "=="), _LeafOp(operator.ne, "!=")  # pyright: ignore[reportAssignmentType]
    __gt__, __ge__ = _LeafOp(operator.gt, ">"), _LeafOp(operator.ge, ">=")
    __neg__, __pos__ = _LeafOp(operator.neg, "-", arity=1), _LeafOp(operator.pos, "+", arity=1)  # fmt: skip
    __abs__, __invert__ = _LeafOp(operator.abs, "abs", arity=1), _LeafOp(operator.invert, "~", arity=1)  # fmt: skip


class _Update:
    """`ω(a).at` (`index` is `None`), and `ω(a).at[index]`, whose `.set(v)`,
    `.add(v)`, ... update every leaf at `index` with `v` (a scalar, an array, or
    an `ω` of the same structure)."""

    __slots__ = ("base", "index")

    def __init__(self, base: ω, index: Any) -> None:
        self.base, self.index = base, index

    def __getitem__(self, index: Any) -> _Update:
        return _Update(self.base, index)

    def __getattr__(self, method: str) -> Callable[..., ω]:
        if method not in _UPDATES:
            raise AttributeError(f"`ω(...).at[...]` has no method {method!r}.")
        base, index = self.base, self.index

        def update(value: Any, **kwargs: Any) -> ω:
            partner = _partner(base, value, f".at[].{method}")

            def one(x: Any, y: Any) -> Any:
                return getattr(x.at[index], method)(y, **kwargs)

            return base._map(one, partner)

        return update
