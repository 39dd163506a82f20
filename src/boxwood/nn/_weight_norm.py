"""`WeightNorm`: reparameterise a layer's weight as direction times magnitude."""

from __future__ import annotations

import operator
from typing import Any, Generic, TypeVar, cast

import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from .._filters import is_array
from .._module import Module, field
from .._tree import tree_at
from ._sequential import takes_key

_Layer = TypeVar("_Layer")


def get_weight(layer: Any, weight_name: str, wrapper: str) -> Array:
    """`getattr(layer, weight_name)`, checked to be an array."""
    weight = getattr(layer, weight_name, None)
    if not is_array(weight):
        raise ValueError(
            f"{wrapper}: the wrapped {type(layer).__name__} has no array attribute "
            f"{weight_name!r} to normalise; pass `weight_name=` naming one."
        )
    return cast(Array, weight)


def call_with_weight(
    layer: Any, weight_name: str, weight: Array, x: Any, key: PRNGKeyArray | None
) -> Any:
    """Call a copy of `layer` whose `weight_name` array is `weight`: as
    `layer(x, key=key)` if the layer takes a key (and one is given), else
    `layer(x)`."""
    swapped = tree_at(operator.attrgetter(weight_name), layer, weight)
    if key is not None and takes_key(swapped):
        return swapped(x, key=key)
    return swapped(x)


def _norm(v: Array, axis: int | None) -> Array:
    """Euclidean norm over every axis except `axis` (all axes if `None`), kept as
    size-1 axes so that it broadcasts against `v`. A square root, not a power of
    0.5: a TPU computes `pow` as `exp(log)`, several float32 ulps from it."""
    axes = tuple(i for i in range(v.ndim) if i != axis)
    return jnp.sqrt((v * v).sum(axis=axes, keepdims=True))


class WeightNorm(Module, Generic[_Layer]):
    r"""Weight normalisation (Salimans & Kingma, 2016) of a wrapped layer's weight.

    The weight is used as $g\, v / \lVert v \rVert$, where $v$ is the wrapped
    layer's weight array (the direction) and $g$ a separate trainable magnitude.
    The norm is taken over every axis except `axis`, so for a `Linear` layer (and
    `axis=0`) each output unit has its own magnitude, as in
    `torch.nn.utils.parametrizations.weight_norm`. At construction $g = \lVert v
    \rVert$, so the wrapped layer initially computes exactly what it did before.

    >>> import jax, jax.numpy as jnp, boxwood.nn as nn
    >>> layer = nn.WeightNorm(nn.Linear(3, 2, key=jax.random.key(0)))
    >>> layer.g.shape
    (2, 1)
    """

    layer: _Layer
    g: Array
    weight_name: str = field(static=True)
    axis: int | None = field(static=True)

    def __init__(
        self, layer: _Layer, weight_name: str = "weight", axis: int | None = 0
    ):
        """**Arguments:**

        - `layer`: the layer to wrap, e.g. a [`boxwood.nn.Linear`][] or a
          convolution.
        - `weight_name`: the name of the layer's weight array.
        - `axis`: the norm is computed over every axis except this one; `None`
          means over all axes (a single magnitude).
        """
        weight = get_weight(layer, weight_name, "WeightNorm")
        if axis is not None:
            if not -weight.ndim <= axis < weight.ndim:
                raise ValueError(
                    f"WeightNorm: `axis={axis}` is out of range for the "
                    f"{weight.ndim}-dimensional weight {weight_name!r}."
                )
            axis = axis % weight.ndim
        self.layer = layer
        self.weight_name = weight_name
        self.axis = axis
        self.g = _norm(weight, axis)

    def normalised_weight(self) -> Array:
        """The effective weight, `g * v / norm(v)`."""
        v = getattr(self.layer, self.weight_name)
        return v * self.g / _norm(v, self.axis)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """**Arguments:**

        - `x`: the wrapped layer's input.
        - `key`: passed on to the wrapped layer if it takes one.

        **Returns:** the wrapped layer's output, computed with the normalised weight.
        """
        return call_with_weight(
            self.layer, self.weight_name, self.normalised_weight(), x, key
        )
