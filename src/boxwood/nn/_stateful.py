"""`StatefulLayer`: the marker base class for layers called as `layer(x, state)`."""

from __future__ import annotations

from collections.abc import Callable

from .._module import AbstractClassVar, Module


class StatefulLayer(Module):
    """Base class for layers that may read and write a [`boxwood.nn.State`][].

    A stateful layer is called as `y, state = layer(x, state, *, key=None)`.
    [`boxwood.nn.Sequential`][] checks `isinstance(layer, StatefulLayer) and
    layer.is_stateful()` to decide between that convention and `y = layer(x)`.
    """

    __call__: AbstractClassVar[Callable]

    def is_stateful(self) -> bool:
        """Whether to call this layer as `(y, state) = layer(x, state)`.

        **Returns:** `True` by default. Subclasses that are only sometimes stateful
        (e.g. a container of possibly-stateful layers) override this.
        """
        return True
