"""Mutable-looking state for immutable models: `StateIndex`, `State`, `make_with_state`.

A stateful layer (e.g. `BatchNorm`) holds a `StateIndex`: a key plus the initial
value of its state. `make_with_state(Model)(...)` builds the model, collects every
index's initial value into a `State`, and strips those initial values out of the
model so that they are not mistaken for trainable parameters. At call time the
layer reads `state.get(index)` and returns `state.set(index, new_value)`.

Keys are names: the path of the index in the model that its `State` was built from
(`"Pair.first.index"`). An index starts out with an unnamed `_Slot`; building a
`State` names the slots of its model in place (every copy of an index shares its
slot, so copies made by `jax.tree_util.tree_map`, `jit`, ... are named too).
Names depend only on where an index sits, so two models built the same way have
equal pytree structures (and share compiled code), while the indices of different
layers in one model always get different names.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import jax.numpy as jnp
import jax.tree_util as jtu

from .._module import Module, field, set_fields
from .._pretty import tree_pformat

_Value = TypeVar("_Value")
_T = TypeVar("_T")

# Every slot hashes alike: a slot's name, and with it what it equals, is set after
# the slot may already sit in a dictionary (a jit cache keyed by a treedef).
_SLOT_HASH = hash("boxwood.nn.StateIndex slot")


class _Slot:
    """The key of a `StateIndex` made by its constructor, shared by all its copies.

    Unnamed, it equals only itself. Once a `State` walk has named it after its
    place in a model, it equals every slot of that name: indices at the same place
    in two builds of one model are then interchangeable.
    """

    __slots__ = ("name",)

    def __init__(self, name: str | None = None):
        self.name = name

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not _Slot:
            return NotImplemented
        return self.name is not None and self.name == other.name

    def __hash__(self) -> int:
        return _SLOT_HASH

    def __reduce__(self) -> tuple:
        return (_Slot, (self.name,))

    def __repr__(self) -> str:
        return "<unnamed>" if self.name is None else repr(self.name)


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

    The key is named after the index's place in the model when the model's `State`
    is built (`make_with_state`, or `State(model)`), so two models built the same
    way have equal structures and reuse each other's compiled code.
    """

    # A `_Slot` when built (named by the first `State(model)` walk), or the name
    # itself: `make_with_state` gives each index a string naming its path.
    marker: Any = field(static=True)
    init: Any

    def __boxwood_shown_fields__(self) -> tuple[str, ...]:
        # what the displays show (`_display/`): the initial value, if any; not the
        # marker, an internal key (the path the model's `State` was built with)
        return () if self.init is None else ("init",)

    def __init__(self, init: _Value):
        """**Arguments:**

        - `init`: the initial value of the state: any pytree of arrays.
        """
        _reject_factory(init)
        self.init, self.marker = init, _Slot()


def _reject_factory(init: Any) -> None:
    if isinstance(init, types.FunctionType):
        raise ValueError(
            "`StateIndex(init)` takes the initial value of the state itself, not a "
            "function that creates it: write `StateIndex(make_init())`."
        )


def _is_index(x: Any) -> bool:
    return isinstance(x, StateIndex)


def make_index(marker: Any, init: Any) -> StateIndex:
    """A `StateIndex` with the given marker (fields set directly: modules are frozen)."""
    new = StateIndex(0)
    set_fields(new, marker=marker, init=init)
    return new


def _name_of(index: StateIndex) -> str | None:
    """The entry `index` addresses, or None while its slot has no name."""
    marker = index.marker
    return marker.name if type(marker) is _Slot else marker


def _indices_with_paths(tree: Any) -> Iterator[tuple[str, StateIndex]]:
    """`(path, index)` for every `StateIndex` in `tree`, in leaf order; each path
    starts with the name of `tree`'s type (`"Pair.first.index"`)."""
    root = type(tree).__name__
    flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=_is_index)
    for path, node in flat:
        if _is_index(node):
            yield root + jtu.keystr(path), node


def _fresh(base: str, taken: dict[str, object]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}#{n}"
    return name


def _name_slots(found: list[tuple[str, StateIndex]]) -> list[str]:
    """Give every unnamed slot among `found` (`(path, index)` pairs from
    `_indices_with_paths`) its path as name; return the entry name of each index.

    A string key, or an already-named slot, keeps its name unless a different key
    of `found` holds that name first (parts whose States were built separately,
    now in one model): such a slot is renamed, so that the two never share an
    entry. A slot reached twice (one layer used twice) is one entry."""
    owners: dict[str, object] = {}  # name -> the key (slot or string) that holds it
    for _, index in found:  # strings first: they cannot be renamed
        if type(index.marker) is not _Slot:
            owners.setdefault(index.marker, index.marker)
    seen: set[int] = set()
    to_name: list[tuple[str, _Slot]] = []
    for path, index in found:
        slot = index.marker
        if type(slot) is not _Slot or id(slot) in seen:
            continue
        seen.add(id(slot))
        if slot.name is None or owners.setdefault(slot.name, slot) is not slot:
            to_name.append((path, slot))
    for path, slot in to_name:
        slot.name = _fresh(path, owners)
        owners[slot.name] = slot
    return [cast(str, _name_of(index)) for _, index in found]


_STALE = (
    "This `State` is out of date: `state.set(...)` (or `state.update(...)`) returned "
    "a new State and this one was retired. Use the returned value, e.g.\n"
    "    y, state = layer(x, state)\n"
    "If you really need to keep an old state, copy it first with\n"
    "    copy = jax.tree_util.tree_map(lambda a: a, state)"
)

_MOVED = (
    "This model's initial states were already moved into a State by "
    "`make_with_state` (and removed from the model). Keep the State that "
    "`make_with_state(Model)(...)` returned, or build a fresh model with "
    "`make_with_state(Model)(...)`."
)


def _layout(tree: Any) -> tuple[Any, list[tuple[tuple[int, ...], Any]]]:
    """Structure plus the shape and dtype of every leaf: what `set` must keep."""
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, [(jnp.shape(leaf), jnp.result_type(leaf)) for leaf in leaves]


def _as_arrays(tree: Any) -> Any:
    return jtu.tree_map(jnp.asarray, tree)


class State:
    """The current value of every [`boxwood.nn.StateIndex`][] in a model.

    Essentially a dictionary from `StateIndex` to pytrees of arrays, and itself a
    pytree (so it passes through `jax.jit`, `jax.vmap`, `jax.lax.scan`, ...). Build
    it with [`boxwood.nn.make_with_state`][]. `set` and `update` return a new
    `State` and retire the old one, so that reusing a stale state is an error
    rather than a silent bug.
    """

    __slots__ = ("_entries",)

    def __init__(self, model: Any):
        """**Arguments:**

        - `model`: any pytree; the initial value of every `StateIndex` in it is
          collected. Indices not yet named are named after their place in `model`
          (in place: the model itself then works with this state). (Usually
          called for you by `make_with_state`.)
        """
        found = list(_indices_with_paths(model))
        if any(type(index.init) is _DeletedInit for _, index in found):
            raise ValueError(_MOVED)
        entries: dict[str, Any] = {}
        for name, (_, index) in zip(_name_slots(found), found):
            if name not in entries:
                entries[name] = _as_arrays(index.init)
        self._entries: dict[str, Any] | None = entries

    @classmethod
    def _of(cls, entries: dict[str, Any]) -> State:
        state = object.__new__(cls)
        state._entries = entries
        return state

    def _current(self) -> dict[str, Any]:
        entries = self._entries
        if entries is None:
            raise ValueError(_STALE)
        return entries

    def _replaced(self, changes: dict[str, Any]) -> State:
        """A new State with `changes` written in; this one is retired."""
        merged = {**self._current(), **changes}
        self._entries = None
        return State._of(merged)

    def _key(self, item: Any) -> str:
        """The entry name of `item`, checked to be an index this State holds."""
        entries = self._current()
        if type(item) is not StateIndex:
            raise ValueError(
                "State keys must be `boxwood.nn.StateIndex` objects, got "
                f"{type(item).__name__}."
            )
        name = _name_of(item)
        if name is None or name not in entries:
            raise ValueError(
                "This State has no entry for the given StateIndex. Build the model and "
                "its state together with `make_with_state(Model)(...)` (or "
                "`State(model)`), and pass that state (or its successors) to the model."
            )
        return name

    def get(self, item: StateIndex[_Value]) -> _Value:
        """The current value stored under `item` (a [`boxwood.nn.StateIndex`][])."""
        return self._current()[self._key(item)]

    def set(self, item: StateIndex[_Value], value: _Value) -> State:
        """Return a new `State` in which `item` holds `value`; `self` is retired.

        **Arguments:**

        - `item`: a [`boxwood.nn.StateIndex`][].
        - `value`: the new value: same pytree structure, shapes and dtypes as before.

        **Returns:** the updated `State`.
        """
        name = self._key(item)
        old, new = self._current()[name], _as_arrays(value)
        if _layout(new) != _layout(old):
            raise ValueError(
                "`State.set`: the new value must have the same structure, shapes and "
                f"dtypes as the old one. Old: {tree_pformat(old)}; new: "
                f"{tree_pformat(new)}."
            )
        return self._replaced({name: new})

    def substate(self, pytree: Any) -> State:
        """A smaller `State` holding only the entries of the indices in `pytree`."""
        entries = self._current()
        names = [self._key(index) for _, index in _indices_with_paths(pytree)]
        return State._of({name: entries[name] for name in names})

    def update(self, substate: State) -> State:
        """Return a new `State` with the entries of `substate` (from `substate()`)
        written in; `self` is retired."""
        if type(substate) is not State:
            raise ValueError(
                f"`State.update` takes a State, got {type(substate).__name__}."
            )
        changes = substate._current()
        if not changes.keys() <= self._current().keys():
            raise ValueError(
                "`state.update(substate)` needs `substate` to come from "
                "`state.substate(...)`: it has an entry this State lacks."
            )
        return self._replaced(changes)

    def __repr__(self) -> str:
        entries = getattr(self, "_entries", None)
        if entries is None:
            return "State(<retired>)"
        shown = (f"{name!r}: {tree_pformat(v)}" for name, v in entries.items())
        return f"State({', '.join(shown)})"


def _state_children(state: State) -> tuple[list, tuple[str, ...]]:
    entries = state._current()
    return list(entries.values()), tuple(entries)


def _state_children_with_keys(state: State) -> tuple[list, tuple[str, ...]]:
    values, names = _state_children(state)
    return [(jtu.DictKey(n), v) for n, v in zip(names, values)], names


def _state_from_children(names: tuple[str, ...], values: Any) -> State:
    return State._of(dict(zip(names, values)))


jtu.register_pytree_with_keys(
    State,
    _state_children_with_keys,
    _state_from_children,
    flatten_func=_state_children,
)


def delete_init_state(model: Any) -> Any:
    """Return a copy of `model` in which every `StateIndex` forgets its initial value.

    The initial values then no longer take memory, nor appear among the model's
    arrays (so they are not trained). [`boxwood.nn.make_with_state`][] does this
    after collecting them into a `State`.
    """
    return jtu.tree_map(
        lambda node: make_index(node.marker, _DELETED) if _is_index(node) else node,
        model,
        is_leaf=_is_index,
    )


def make_with_state(make_model: Callable[..., _T]) -> Callable[..., tuple[_T, State]]:
    """Build a stateful model and its initial [`boxwood.nn.State`][].

    `make_with_state(Model)(*args, **kwargs)` calls `Model(*args, **kwargs)`, gives
    every [`boxwood.nn.StateIndex`][] a key naming its place in the model (so two
    builds of the same model have interchangeable states), collects the initial
    values into a `State`, and removes them from the model. A layer that appears
    at two places gets a state entry at each.

    **Arguments:**

    - `make_model`: any callable returning a pytree (typically a Module class).

    **Returns:** a callable returning `(model, state)`.

    >>> import boxwood.nn as nn
    >>> bn, state = nn.make_with_state(nn.BatchNorm)(3, axis_name="batch")
    >>> state.get(bn.state_index)[1]
    Array([1., 1., 1.], dtype=float32)
    """

    def build(*args: Any, **kwargs: Any) -> tuple[_T, State]:
        built = make_model(*args, **kwargs)
        paths = iter([path for path, _ in _indices_with_paths(built)])
        # Fresh string keys, one per place: the indices of `built` are untouched.
        renamed = jtu.tree_map(
            lambda node: (
                make_index(next(paths), node.init) if _is_index(node) else node
            ),
            built,
            is_leaf=_is_index,
        )
        return delete_init_state(renamed), State(renamed)

    return build
