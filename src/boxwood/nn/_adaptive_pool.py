"""Adaptive pooling: a fixed output shape whatever the input's spatial shape."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from .._module import Module, field
from ._checks import check_floating, check_input, layer_name
from ._conv_utils import as_tuple, check_positive_int, spatial_names
from ._pool import PoolInput, PoolOutput


def _bins(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's bins: `[floor(i * size / out), ceil((i + 1) * size / out))`."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def _pool_axis(x: Array, axis: int, out: int, operation: Callable) -> Array:
    """Reduce axis `axis` of `x` to `out` bins, applying `operation` to each bin."""
    x = jnp.moveaxis(x, axis, -1)
    lead, size = x.shape[:-1], x.shape[-1]
    bins = _bins(size, out)
    by_width: dict[int, list[int]] = {}
    for i, (start, end) in enumerate(bins):
        by_width.setdefault(end - start, []).append(i)
    pieces, order = [], []
    for width, members in by_width.items():
        if len(members) == out and width * out == size:
            windows = x.reshape(*lead, out, width)  # equal, disjoint bins
        else:
            index = np.array([np.arange(bins[i][0], bins[i][1]) for i in members])
            windows = x[..., index]
        reduced = jax.vmap(operation)(windows.reshape(-1, width))
        pieces.append(reduced.reshape(*lead, len(members)))
        order.extend(members)
    y = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=-1)
    if order != sorted(order):
        y = y[..., np.argsort(order)]
    return jnp.moveaxis(y, -1, axis)


class AdaptivePool(Module):
    """General N-dimensional adaptive pooling to a fixed output shape.

    Same signature as `equinox.nn.AdaptivePool`. Output position `i` along a spatial
    axis of size `n` (output size `m`) reduces the input bin
    `[floor(i * n / m), ceil((i + 1) * n / m))`, PyTorch's bins, so results match
    PyTorch's adaptive pools exactly also when `m` does not divide `n` (bins may then
    differ in size and overlap) or when `m > n`.
    """

    target_shape: tuple[int, ...] = field(static=True)
    num_spatial_dims: int = field(static=True)
    operation: Callable = field(static=True)

    # Static fields shown in error messages; the 1d/2d/3d classes drop the first.
    _name_fields = ("num_spatial_dims", "target_shape")

    def __init__(
        self,
        target_shape: int | Sequence[int],
        num_spatial_dims: int,
        operation: Callable,
    ):
        """**Arguments:**

        - `target_shape`: the output's spatial shape; an int (the same along every
          spatial axis) or a sequence of `num_spatial_dims` ints.
        - `num_spatial_dims`: the number of spatial dimensions.
        - `operation`: maps a one-dimensional array (one bin) to a scalar, such as
          `jnp.mean` or `jnp.max`.
        """
        if not callable(operation):
            raise ValueError(f"`operation` must be callable, got {operation!r}.")
        n = check_positive_int(num_spatial_dims, "num_spatial_dims")
        self.num_spatial_dims = n
        self.target_shape = as_tuple(target_shape, n, "target_shape")
        self.operation = operation

    def _checked(self, x: Any) -> Array:
        x = jnp.asarray(x)
        expected = ("channels", *spatial_names(self.num_spatial_dims))
        check_input(x, expected, layer_name(self, *self._name_fields))
        if 0 in x.shape[1:]:
            raise ValueError(
                f"{layer_name(self, *self._name_fields)}: cannot pool an input with an "
                f"empty spatial axis, got shape {x.shape}."
            )
        return x

    def __call__(self, x: PoolInput, *, key: PRNGKeyArray | None = None) -> PoolOutput:
        """**Arguments:**

        - `x`: a single example of shape `(channels, *spatial)`. Batch with
          `jax.vmap`.
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(channels, *target_shape)`.
        """
        del key
        x = self._checked(x)
        for axis, out in enumerate(self.target_shape, start=1):
            x = _pool_axis(x, axis, out, self.operation)
        return x


class _AdaptiveAvgPool(AdaptivePool):
    def __call__(self, x: PoolInput, *, key: PRNGKeyArray | None = None) -> PoolOutput:
        """**Arguments:**

        - `x`: a single floating-point example of shape `(channels, *spatial)`.
          Batch with `jax.vmap`.
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(channels, *target_shape)`.
        """
        check_floating(x, layer_name(self, *self._name_fields))
        return super().__call__(x, key=key)


class AdaptiveAvgPool1d(_AdaptiveAvgPool):
    """Adaptive average pooling of `(channels, length)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int]):
        """**Arguments:**

        - `target_shape`: the output length (an int or a sequence of one int).
        """
        AdaptivePool.__init__(self, target_shape, 1, jnp.mean)


class AdaptiveAvgPool2d(_AdaptiveAvgPool):
    """Adaptive average pooling of `(channels, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int]):
        """**Arguments:**

        - `target_shape`: the output `(height, width)`; an int for both.
        """
        AdaptivePool.__init__(self, target_shape, 2, jnp.mean)


class AdaptiveAvgPool3d(_AdaptiveAvgPool):
    """Adaptive average pooling of `(channels, depth, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int]):
        """**Arguments:**

        - `target_shape`: the output `(depth, height, width)`; an int for all three.
        """
        AdaptivePool.__init__(self, target_shape, 3, jnp.mean)


class AdaptiveMaxPool1d(AdaptivePool):
    """Adaptive max pooling of `(channels, length)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int]):
        """**Arguments:**

        - `target_shape`: the output length (an int or a sequence of one int).
        """
        super().__init__(target_shape, 1, jnp.max)


class AdaptiveMaxPool2d(AdaptivePool):
    """Adaptive max pooling of `(channels, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int]):
        """**Arguments:**

        - `target_shape`: the output `(height, width)`; an int for both.
        """
        super().__init__(target_shape, 2, jnp.max)


class AdaptiveMaxPool3d(AdaptivePool):
    """Adaptive max pooling of `(channels, depth, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int]):
        """**Arguments:**

        - `target_shape`: the output `(depth, height, width)`; an int for all three.
        """
        super().__init__(target_shape, 3, jnp.max)
