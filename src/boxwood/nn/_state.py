"""Mutable-looking state for immutable models: `StateIndex`, `State`, `make_with_state`.

A stateful layer (e.g. `BatchNorm`) holds a `StateIndex`: a unique key plus the
initial value of its state. `make_with_state(Model)(...)` builds the model, collects
every index's initial value into a `State`, and strips those initial values out of
the model so that they are not mistaken for trainable parameters. At call time the
layer reads `state.get(index)` and returns `state.set(index, new_value)`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax.numpy as jnp
import jax.tree_util as jtu

from .._module import Module, field
from .._module._instance import set_fields
from .._pretty import tree_pformat

_Value = TypeVar("_Value")
_T = TypeVar("_T")


class _DeletedInit(Module):
    """Stands in for an initial state that `make_with_state` removed (no leaves)."""

    def __repr__(self) -> str:
        return "<deleted>"


_DELETED = _DeletedInit()


class StateIndex(Module, Generic[_Value]):
    """A key into a [`boxwood.nn.State`][], together with the initial value of the state.

    ```python
    class Counter(boxwood.Module):
        index: boxwood.nn.StateIndex

        def __init__(self):
            self.index = boxwood.nn.StateIndex(jnp.array(0))

        def __call__(self, x, state):
            count = state.get(self.index)
            return x + count, state.set(self.index, count + 1)

    counter, state = boxwood.nn.make_with_state(Counter)()
    ```
    """

    # An `object()` when built; `make_with_state` replaces it by a string naming the
    # index's path in the model, so that two builds of a model share their keys.
    marker: Any = field(static=True)
    init: Any

    def __init__(self, init: _Value):
        """**Arguments:**

        - `init`: the initial value of the state: any pytree of arrays.
        """
        if isinstance(init, types.FunctionType):
            raise ValueError(
                "`StateIndex(init)` takes the initial value of the state itself, not a "
                "function that creates it: write `StateIndex(make_init())`."
            )
        self.marker = object()
        self.init = init


def _is_index(x: Any) -> bool:
    return isinstance(x, StateIndex)


def _make_index(marker: Any, init: Any) -> StateIndex:
    """A `StateIndex` with the given marker (fields set directly: modules are frozen)."""
    new = StateIndex(0)
    set_fields(new, marker=marker, init=init)
    return new


_STALE = (
    "This `State` is out of date: `state.set(...)` (or `state.update(...)`) returned "
    "a new State and this one was retired. Use the returned value, e.g.\n"
    "    y, state = layer(x, state)\n"
    "If you really need to keep an old state, copy it first with\n"
    "    copy = jax.tree_util.tree_map(lambda a: a, state)"
)


def _check_key(item: Any) -> None:
    if type(item) is not StateIndex:
        raise ValueError(
            f"State keys must be `boxwood.nn.StateIndex` objects, got "
            f"{type(item).__name__}."
        )


def _struct(tree: Any) -> tuple[Any, list[tuple[tuple[int, ...], Any]]]:
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, [(jnp.shape(x), jnp.result_type(x)) for x in leaves]


class State:
    """The current value of every [`boxwood.nn.StateIndex`][] in a model.

    Essentially a dictionary from `StateIndex` to pytrees of arrays, and itself a
    pytree (so it passes through `jax.jit`, `jax.vmap`, `jax.lax.scan`, ...). Build
    it with [`boxwood.nn.make_with_state`][]. `set` and `update` return a new
    `State` and retire the old one, so that reusing a stale state is an error
    rather than a silent bug.
    """

    __slots__ = ("_values",)

    def __init__(self, model: Any):
        """**Arguments:**

        - `model`: any pytree; the initial value of every `StateIndex` in it is
          collected. (Usually called for you by `make_with_state`.)
        """
        values = {}
        for leaf in jtu.tree_leaves(model, is_leaf=_is_index):
            if _is_index(leaf):
                if isinstance(leaf.init, _DeletedInit):
                    raise ValueError(
                        "This model's initial states were already moved into a State "
                        "by `make_with_state` (and removed from the model). Keep the "
                        "State that `make_with_state(Model)(...)` returned, or build a "
                        "fresh model with `make_with_state(Model)(...)`."
                    )
                values[leaf.marker] = jtu.tree_map(jnp.asarray, leaf.init)
        self._values: dict | None = values

    @classmethod
    def _from_dict(cls, values: dict) -> State:
        new = object.__new__(cls)
        new._values = values
        return new

    def _live(self) -> dict:
        if self._values is None:
            raise ValueError(_STALE)
        return self._values

    def _retire(self, values: dict) -> State:
        self._values = None
        return State._from_dict(values)

    def get(self, item: StateIndex[_Value]) -> _Value:
        """The current value stored under `item` (a [`boxwood.nn.StateIndex`][])."""
        values = self._live()
        _check_key(item)
        try:
            return values[item.marker]
        except KeyError:
            raise ValueError(
                "This State has no entry for the given StateIndex. Build the model and "
                "its state together with `make_with_state(Model)(...)`, and pass that "
                "state (or its successors) to the model."
            ) from None

    def set(self, item: StateIndex[_Value], value: _Value) -> State:
        """Return a new `State` in which `item` holds `value`; `self` is retired.

        **Arguments:**

        - `item`: a [`boxwood.nn.StateIndex`][].
        - `value`: the new value: same pytree structure, shapes and dtypes as before.

        **Returns:** the updated `State`.
        """
        old = self.get(item)
        value = jtu.tree_map(jnp.asarray, value)
        if _struct(old) != _struct(value):
            raise ValueError(
                "`State.set`: the new value must have the same structure, shapes and "
                f"dtypes as the old one. Old: {tree_pformat(old)}; new: "
                f"{tree_pformat(value)}."
            )
        values = dict(self._live())
        values[item.marker] = value
        return self._retire(values)

    def substate(self, pytree: Any) -> State:
        """A smaller `State` holding only the entries of the indices in `pytree`."""
        values = self._live()
        leaves = jtu.tree_leaves(pytree, is_leaf=_is_index)
        markers = [x.marker for x in leaves if _is_index(x)]
        return State._from_dict({m: values[m] for m in markers})

    def update(self, substate: State) -> State:
        """Return a new `State` with the entries of `substate` (from `substate()`)
        written in; `self` is retired."""
        if type(substate) is not State:
            raise ValueError(
                f"`State.update` takes a State, got {type(substate).__name__}."
            )
        values = dict(self._live())
        for marker, value in substate._live().items():
            if marker not in values:
                raise ValueError(
                    "`state.update(substate)` needs `substate` to come from "
                    "`state.substate(...)`: it has an entry this State lacks."
                )
            values[marker] = value
        return self._retire(values)

    def __repr__(self) -> str:
        values = getattr(self, "_values", None)
        if values is None:
            return "State(<retired>)"
        items = ", ".join(f"{k!r}: {tree_pformat(v)}" for k, v in values.items())
        return f"State({items})"

    def _flatten_with_keys(self) -> tuple[list, tuple]:
        values = self._live()
        keys = tuple(values)
        return [(jtu.DictKey(k), values[k]) for k in keys], keys

    @classmethod
    def _unflatten(cls, keys: tuple, children: Any) -> State:
        return cls._from_dict(dict(zip(keys, children)))


jtu.register_pytree_with_keys(
    State,
    State._flatten_with_keys,
    State._unflatten,
    flatten_func=lambda s: (list(s._live().values()), tuple(s._live())),
)


def delete_init_state(model: Any) -> Any:
    """Return a copy of `model` in which every `StateIndex` forgets its initial value.

    The initial values then no longer take memory, nor appear among the model's
    arrays (so they are not trained). [`boxwood.nn.make_with_state`][] does this
    after collecting them into a `State`.
    """

    def strip(x: Any) -> Any:
        return _make_index(x.marker, _DELETED) if _is_index(x) else x

    return jtu.tree_map(strip, model, is_leaf=_is_index)


def make_with_state(make_model: Callable[..., _T]) -> Callable[..., tuple[_T, State]]:
    """Build a stateful model and its initial [`boxwood.nn.State`][].

    `make_with_state(Model)(*args, **kwargs)` calls `Model(*args, **kwargs)`, gives
    every [`boxwood.nn.StateIndex`][] a key naming its place in the model (so two
    builds of the same model have interchangeable states), collects the initial
    values into a `State`, and removes them from the model.

    **Arguments:**

    - `make_model`: any callable returning a pytree (typically a Module class).

    **Returns:** a callable returning `(model, state)`.

    >>> import boxwood.nn as nn
    >>> bn, state = nn.make_with_state(nn.BatchNorm)(3, axis_name="batch")
    >>> state.get(bn.state_index)[1]
    Array([1., 1., 1.], dtype=float32)
    """

    def build(*args: Any, **kwargs: Any) -> tuple[_T, State]:
        model = make_model(*args, **kwargs)
        pairs, treedef = jtu.tree_flatten_with_path(model, is_leaf=_is_index)
        prefix = type(model).__name__
        leaves = [
            _make_index(prefix + jtu.keystr(path), leaf.init)
            if _is_index(leaf)
            else leaf
            for path, leaf in pairs
        ]
        model = jtu.tree_unflatten(treedef, leaves)
        return delete_init_state(model), State(model)

    return build
