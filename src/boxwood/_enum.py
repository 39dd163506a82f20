"""`Enumeration`: enums whose items are pytrees, usable under `jit` and `vmap`."""

from __future__ import annotations

import operator
import sys
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._errors import branched_error_if
from ._module import Module, field

_RESERVED = ("promote", "where")


class EnumerationItem(Module):
    """One item of an [`boxwood.Enumeration`][]: an int32 array (a leaf, so it can be
    traced, selected with `where` and batched) and its enumeration (static)."""

    _value: Any
    _enumeration: Any = field(static=True)

    def _against(self, other: Any, compare: Callable[[Any, Any], Any]) -> Any:
        """`compare` of the two items' values, as a JAX boolean."""
        if (
            not isinstance(other, EnumerationItem)
            or other._enumeration is not self._enumeration
        ):
            raise ValueError(
                f"An item of `{self._enumeration.__qualname__}` can only be compared "
                f"with items of the same enumeration; got {other!r}."
            )
        mine, theirs = self._value, other._value
        if not isinstance(mine, jax.core.Tracer) and not isinstance(
            theirs, jax.core.Tracer
        ):
            # Two known items (one of the class's, say): compared in NumPy and
            # placed as a JAX array (libraries annotate the result as one), so that
            # no eager JAX operation is compiled for it on first use; known even
            # inside a trace.
            known = np.asarray(compare(np.asarray(mine), np.asarray(theirs)))
            with jax.ensure_compile_time_eval():
                return jax.device_put(known)
        return jnp.asarray(compare(mine, theirs))

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return self._against(other, operator.eq)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return self._against(other, operator.ne)

    # unhashable on purpose: equality is elementwise
    __hash__ = None  # pyright: ignore[reportAssignmentType]

    def __repr__(self) -> str:
        cls = self._enumeration
        return f"{cls.__module__}.{cls.__qualname__}<{cls[self]}>"

    def error_if(self, token: Any, pred: Any) -> Any:
        """Raise this item's message as an error if `pred` is true; see
        [`boxwood.error_if`][].

        **Arguments:**

        - `token`: a pytree with at least one array, returned unchanged; the check
          runs when it is computed.
        - `pred`: the condition.

        **Returns:**

        `token`.
        """
        messages = self._enumeration._table.messages
        return branched_error_if(token, pred, self._value, messages)

    def is_traced(self) -> bool:
        """Whether the item's value is a tracer (known only when the program runs)."""
        return isinstance(self._value, jax.core.Tracer)


class _Table:
    """The items of one enumeration class. Item `i` has the message `messages[i]`;
    `translate[parent]` maps the item numbers of an enumeration it inherits from to
    its own (an inherited name keeps one number, whichever parent it came from)."""

    __slots__ = ("owner", "number", "messages", "items", "translate")

    def __init__(self, owner: type) -> None:
        self.owner = owner
        self.number: dict[str, int] = {}
        self.messages: list[str] = []
        self.items: dict[str, EnumerationItem] = {}
        self.translate: dict[type, np.ndarray] = {}

    def define(self, name: str, message: str) -> int:
        """Give `name` the next number, or (when it is already defined) its new
        message; returns its number."""
        if name not in self.number:
            self.number[name] = len(self.messages)
            self.messages.append(message)
            value = np.array(self.number[name], np.int32)
            self.items[name] = EnumerationItem(value, self.owner)
        elif self.messages[self.number[name]] != message:
            warnings.warn(
                f"Enumeration `{self.owner.__qualname__}` gives `{name}` the message "
                f"{message!r}, which replaces the inherited "
                f"{self.messages[self.number[name]]!r}.",
                stacklevel=_class_statement_level(),
            )
            self.messages[self.number[name]] = message
        return self.number[name]

    def inherit(self, parent: type) -> None:
        table: _Table = parent.__dict__["_table"]
        ordered = sorted(table.number.items(), key=lambda pair: pair[1])
        self.translate[parent] = np.array(
            [self.define(name, table.messages[i]) for name, i in ordered], np.int32
        )


def _class_statement_level() -> int:
    """`stacklevel` for a warning about a class statement: the first frame outside
    this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _entries(cls_name: str, namespace: dict) -> dict[str, str]:
    """The items a class body defines (every non-dunder name), checked."""
    entries = {k: v for k, v in namespace.items() if not _dunder(k)}
    for k, v in entries.items():
        if k in _RESERVED:
            raise ValueError(
                f"An enumeration item cannot be named `{k}`: it is a method of every "
                "enumeration."
            )
        if not isinstance(v, str):
            raise TypeError(
                f"`{cls_name}.{k}` must be a string (its message); got "
                f"{type(v).__name__} {v!r}."
            )
    return entries


def _enumeration_parents(cls_name: str, bases: tuple) -> list[type]:
    """Every enumeration `bases` inherit from (along each base's MRO, in order,
    once each); anything else they inherit is refused."""
    found: list[type] = []
    for ancestor in (a for base in bases for a in base.__mro__):
        if ancestor is object or ancestor is Enumeration or ancestor in found:
            continue
        if not isinstance(ancestor, _EnumerationMeta):
            raise TypeError(
                f"`{cls_name}`: an enumeration can only inherit from enumerations."
            )
        found.append(ancestor)
    return found


class _EnumerationMeta(type):
    _table: _Table

    def __new__(mcs, name: str, bases: tuple, namespace: dict) -> Any:
        entries = _entries(name, namespace) if bases else {}
        body = {k: v for k, v in namespace.items() if k not in entries}
        cls = super().__new__(mcs, name, bases, body)
        table = _Table(cls)
        type.__setattr__(cls, "_table", table)
        if bases:
            for parent in _enumeration_parents(name, bases):
                table.inherit(parent)
            for entry, message in entries.items():
                table.define(entry, message)
        return cls

    def __getattr__(cls, name: str) -> EnumerationItem:
        try:
            return cls.__dict__["_table"].items[name]
        except KeyError:
            raise AttributeError(
                f"Enumeration `{cls.__qualname__}` has no item `{name}`."
            ) from None

    def __getitem__(cls, item: EnumerationItem) -> str:
        if not isinstance(item, EnumerationItem) or item._enumeration is not cls:
            raise ValueError(
                f"`{cls.__qualname__}[...]` takes an item of `{cls.__qualname__}`; "
                f"got {type(item).__name__}."
            )
        if isinstance(item._value, jax.core.Tracer):
            return "traced"
        messages = np.array(cls._table.messages, dtype=object)
        return str(messages[np.asarray(item._value)])

    def __len__(cls) -> int:
        return len(cls._table.items)

    def __instancecheck__(cls, value: Any) -> bool:
        return isinstance(value, EnumerationItem) and value._enumeration is cls


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class Enumeration(metaclass=_EnumerationMeta):
    """Enumerations whose items are pytrees: they pass through `jax.jit`, can be
    selected with `where` and compared under `vmap`, and carry error messages.

    Define one with class syntax, one string (its message) per item; read items from
    the class, and an item's message by indexing the class. Subclasses extend an
    enumeration; `Sub.promote(item)` converts an item of the parent.

    >>> import boxwood, jax.numpy as jnp
    >>> class RESULTS(boxwood.Enumeration):
    ...     success = ""
    ...     diverged = "the solver diverged"
    >>> result = RESULTS.where(jnp.array(False), RESULTS.success, RESULTS.diverged)
    >>> bool(result == RESULTS.diverged), RESULTS[result]
    (True, 'the solver diverged')
    >>> result
    boxwood._enum.RESULTS<the solver diverged>
    """

    @classmethod
    def promote(cls, item: EnumerationItem) -> EnumerationItem:
        """`item`, an item of a parent enumeration, as the same item of `cls`."""
        if not isinstance(item, EnumerationItem):
            raise ValueError(f"`{cls.__qualname__}.promote` takes an enumeration item.")
        source = item._enumeration
        translate = cls._table.translate.get(source)
        if translate is None:
            raise ValueError(
                f"`{cls.__qualname__}.promote` converts items of the enumerations it "
                f"inherits from; `{source.__qualname__}` is not one of them."
            )
        with jax.ensure_compile_time_eval():
            value = jnp.asarray(translate)[item._value]
        return EnumerationItem(value, cls)

    @classmethod
    def where(
        cls, pred: Any, a: EnumerationItem, b: EnumerationItem
    ) -> EnumerationItem:
        """`a` where the scalar boolean `pred` is true, else `b` (as `jnp.where`)."""
        if jnp.shape(pred) != () or jnp.result_type(pred) != jnp.bool_:
            raise ValueError(
                f"`{cls.__qualname__}.where` needs a scalar boolean `pred`; got "
                f"shape {jnp.shape(pred)} and dtype {jnp.result_type(pred)}."
            )
        for arg, value in (("a", a), ("b", b)):
            if not isinstance(value, cls):
                raise ValueError(
                    f"`{cls.__qualname__}.where`: `{arg}` must be an item of "
                    f"`{cls.__qualname__}`; got {value!r}."
                )
        if a._value is b._value:
            return a
        with jax.ensure_compile_time_eval():
            return EnumerationItem(jnp.where(pred, a._value, b._value), cls)
