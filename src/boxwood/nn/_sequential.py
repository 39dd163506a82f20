"""`Sequential` (layers applied in order, threading state) and `Lambda`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax.random as jr
from jaxtyping import Array, PRNGKeyArray

from .._module import Module
from ._callables import store_callable
from ._state import State
from ._stateful import StatefulLayer

_NO_STATE: Any = object()


@functools.lru_cache(maxsize=512)
def _signature_takes_key(call: Callable) -> bool:
    try:
        params = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):  # no signature available: assume it does not
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == "key" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in params
    )


def takes_key(layer: Callable) -> bool:
    """Whether `layer(x, key=...)` is a valid call."""
    if isinstance(layer, Module):
        return _signature_takes_key(type(layer).__call__)
    try:
        return _signature_takes_key(layer)
    except TypeError:  # unhashable callable: look it up without the cache
        return _signature_takes_key.__wrapped__(layer)


def _is_stateful(layer: Any) -> bool:
    return isinstance(layer, StatefulLayer) and layer.is_stateful()


class Sequential(StatefulLayer):
    """A sequence of layers applied in order.

    Called as `y = seq(x, key=...)`, or as `y, state = seq(x, state, key=...)` when
    any member is stateful (a [`boxwood.nn.StatefulLayer`][] whose `is_stateful()`
    is true); the state is passed through every stateful member in turn. Wrap plain
    functions (activations) in [`boxwood.nn.Lambda`][].

    >>> import jax, jax.numpy as jnp, boxwood.nn as nn
    >>> seq = nn.Sequential([nn.Lambda(jnp.sin), nn.Lambda(jnp.cos)])
    >>> seq(jnp.zeros(2))
    Array([1., 1.], dtype=float32)
    """

    layers: tuple

    def __init__(self, layers: Sequence[Callable]):
        """**Arguments:**

        - `layers`: the layers, in order: modules (or other callables taking one
          input).
        """
        self.layers = tuple(layers)

    def is_stateful(self) -> bool:
        return any(_is_stateful(layer) for layer in self.layers)

    def __call__(
        self, x: Array, state: State = _NO_STATE, *, key: PRNGKeyArray | None = None
    ) -> Array | tuple[Array, State]:
        """**Arguments:**

        - `x`: the input of the first layer.
        - `state`: a [`boxwood.nn.State`][]; required when a member is stateful.
        - `key`: if given, split into one subkey per layer; each layer whose
          `__call__` takes a `key` argument gets its own.

        **Returns:** the last layer's output, or `(output, state)` if `state` was
        given.
        """
        keys = (
            [None] * len(self.layers)
            if key is None
            else jr.split(key, len(self.layers))
        )
        for i, (layer, subkey) in enumerate(zip(self.layers, keys)):
            kwargs = {} if subkey is None or not takes_key(layer) else {"key": subkey}
            if _is_stateful(layer):
                if state is _NO_STATE:
                    raise ValueError(
                        f"Sequential: layer {i} ({type(layer).__name__}) is stateful, so "
                        "the Sequential must be called as `y, state = seq(x, state)` "
                        "with the State from `boxwood.nn.make_with_state`."
                    )
                x, state = layer(x, state, **kwargs)
            else:
                x = layer(x, **kwargs)
        return x if state is _NO_STATE else (x, state)

    def __getitem__(self, i: int | slice) -> Any:
        """Layer `i`, or a `Sequential` of the layers a slice `i` selects."""
        if not isinstance(i, (int, slice)):
            raise TypeError(
                f"Sequential indices must be ints or slices, got {type(i).__name__}."
            )
        chosen = self.layers[i]
        return Sequential(chosen) if isinstance(i, slice) else chosen

    def __iter__(self) -> Iterator:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)


class Lambda(Module):
    """Wraps a function (e.g. an activation) as a layer, for use in
    [`boxwood.nn.Sequential`][]: `Lambda(fn)(x, key=key)` is `fn(x)`.

    As in Equinox, `fn` may carry parameters: `Lambda(boxwood.Partial(f, w))` holds
    the array `w` as a leaf (trained, and traced by `filter_jit`). A plain function
    is instead held as static structure (in a [`boxwood.nn.StaticFunction`][] at
    `.fn`, whose `.fn` is the function), so the layer has no leaves and
    `jax.jit(layer)` works; it must be hashable, as plain functions are.

    >>> import jax, jax.numpy as jnp, boxwood.nn as nn
    >>> nn.Lambda(jax.nn.relu)(jnp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    """

    fn: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any]):
        """**Arguments:**

        - `fn`: the function to apply: a plain function, or a callable pytree with
          parameters (a Module, a `boxwood.Partial`).
        """
        self.fn = store_callable(fn, "Lambda: `fn`")

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """**Arguments:**

        - `x`: the input.
        - `key`: ignored.

        **Returns:** `fn(x)`.
        """
        return self.fn(x)
