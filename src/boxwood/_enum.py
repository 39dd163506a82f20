"""`Enumeration`: enums whose items are pytrees, usable under `jit` and `vmap`."""

from __future__ import annotations

import warnings
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

    def _same(self, other: Any) -> None:
        if not (
            isinstance(other, EnumerationItem)
            and other._enumeration is self._enumeration
        ):
            raise ValueError(
                f"An item of `{self._enumeration.__qualname__}` can only be compared "
                f"with items of the same enumeration; got {other!r}."
            )

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        self._same(other)
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self._value == other._value)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        self._same(other)
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self._value != other._value)

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
        messages = self._enumeration._index_to_message
        return branched_error_if(token, pred, self._value, messages)

    def is_traced(self) -> bool:
        """Whether the item's value is a tracer (known only when the program runs)."""
        return isinstance(self._value, jax.core.Tracer)


def _add(cls: Any, name: str, message: str) -> int:
    """Store `name: message` in `cls`; an inherited name keeps its index."""
    item = cls._name_to_item.get(name)
    if item is None:
        index = len(cls._index_to_message)
        cls._name_to_item[name] = EnumerationItem(np.array(index, np.int32), cls)
        cls._index_to_message.append(message)
        return index
    index = int(item._value)
    if cls._index_to_message[index] != message:
        warnings.warn(
            f"Enumeration `{cls.__qualname__}` gives `{name}` the message {message!r}, "
            f"which replaces the inherited {cls._index_to_message[index]!r}.",
            stacklevel=4,
        )
        cls._index_to_message[index] = message
    return index


class _EnumerationMeta(type):
    _name_to_item: dict[str, EnumerationItem]
    _index_to_message: list[str]
    _base_offsets: dict[type, np.ndarray]

    def __new__(mcs, name: str, bases: tuple, namespace: dict) -> Any:
        items = {k: v for k, v in namespace.items() if not _dunder(k)}
        if bases:
            for k in _RESERVED:
                if k in items:
                    raise ValueError(
                        f"An enumeration item cannot be named `{k}`: it is a method "
                        "of every enumeration."
                    )
            for k, v in items.items():
                if not isinstance(v, str):
                    raise TypeError(
                        f"`{name}.{k}` must be a string (its message); got "
                        f"{type(v).__name__} {v!r}."
                    )
            namespace = {k: v for k, v in namespace.items() if k not in items}
        cls = super().__new__(mcs, name, bases, namespace)
        cls._name_to_item, cls._index_to_message, cls._base_offsets = {}, [], {}
        ancestors = [b for direct in bases for b in direct.__mro__]
        for base in ancestors:
            if base is Enumeration or not isinstance(base, _EnumerationMeta):
                if not isinstance(base, _EnumerationMeta) and base is not object:
                    raise TypeError(
                        f"`{name}`: an enumeration can only inherit from enumerations."
                    )
                continue
            if base in cls._base_offsets:
                continue
            offsets = np.zeros(len(base), np.int32)
            for k, item in base._name_to_item.items():
                message = base._index_to_message[int(item._value)]
                offsets[int(item._value)] = _add(cls, k, message)
            cls._base_offsets[base] = offsets
        if bases:
            for k, v in items.items():
                _add(cls, k, v)
        return cls

    def __getattr__(cls, name: str) -> EnumerationItem:
        try:
            return cls.__dict__["_name_to_item"][name]
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
        value = item._value
        if isinstance(value, jax.core.Tracer):
            return "traced"
        return str(np.vectorize(lambda i: cls._index_to_message[i])(np.asarray(value)))

    def __len__(cls) -> int:
        return len(cls._name_to_item)

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
        if source is cls or source not in cls._base_offsets:
            raise ValueError(
                f"`{cls.__qualname__}.promote` converts items of the enumerations it "
                f"inherits from; `{source.__qualname__}` is not one of them."
            )
        with jax.ensure_compile_time_eval():
            value = jnp.asarray(cls._base_offsets[source])[item._value]
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
