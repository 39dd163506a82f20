"""Adaptive pooling: a fixed output shape whatever the input's spatial shape."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from .._module import Module, field
from ._conv_utils import as_tuple, check_positive_int, spatial_names
from ._defaults import default_floating_dtype
from ._input_checks import check_input, layer_name
from ._pool import PoolInput, PoolOutput


def _bins(size: int, out: int, style: str) -> list[tuple[int, int]]:
    """The `[start, end)` of each of the `out` bins of an axis of `size` entries.

    `"equinox"`: disjoint bins, the first `size % out` one entry wider than the rest
    (Equinox's split). `"torch"`, or when `out > size` (where Equinox's split has
    empty bins): PyTorch's `[floor(i * size / out), ceil((i + 1) * size / out))`.
    """
    if style == "equinox" and out <= size:
        small, wide = size // out, size % out
        starts = [i * (small + 1) if i < wide else wide + i * small for i in range(out)]
        return [(s, s + small + (i < wide)) for i, s in enumerate(starts)]
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def _pool_axis(
    x: Array, axis: int, out: int, operation: Callable, style: str = "equinox"
) -> Array:
    """Reduce axis `axis` of `x` to `out` bins, applying `operation` to each bin."""
    x = jnp.moveaxis(x, axis, -1)
    lead, size = x.shape[:-1], x.shape[-1]
    bins = _bins(size, out, style)
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

    Same signature as `equinox.nn.AdaptivePool`, plus `bins`. A spatial axis of
    size `n` pooled to `m` outputs is cut into bins as Equinox cuts it
    (`bins="equinox"`, the default): `m` disjoint bins, the first `n % m` of
    `n // m + 1` entries and the rest of `n // m`. `bins="torch"` takes PyTorch's
    bins instead, `[floor(i * n / m), ceil((i + 1) * n / m))` (they may overlap),
    so results match PyTorch's adaptive pools exactly; the two agree when `m`
    divides `n`. When `m > n` (where Equinox's split fails) PyTorch's bins are used.
    """

    target_shape: tuple[int, ...] = field(static=True)
    num_spatial_dims: int = field(static=True)
    operation: Callable = field(static=True)
    bins: str = field(static=True, default="equinox")

    # Static fields shown in error messages; the 1d/2d/3d classes drop the first.
    _name_fields = ("num_spatial_dims", "target_shape")

    def __init__(
        self,
        target_shape: int | Sequence[int],
        num_spatial_dims: int,
        operation: Callable,
        *,
        bins: str = "equinox",
    ):
        """**Arguments:**

        - `target_shape`: the output's spatial shape; an int (the same along every
          spatial axis) or a sequence of `num_spatial_dims` ints.
        - `num_spatial_dims`: the number of spatial dimensions.
        - `operation`: maps a one-dimensional array (one bin) to a scalar, such as
          `jnp.mean` or `jnp.max`.
        - `bins`: `"equinox"` (the default) or `"torch"`: how an axis is cut into
          bins when the output size does not divide the input size (see above).
          (Keyword only.)
        """
        if not callable(operation):
            raise ValueError(f"`operation` must be callable, got {operation!r}.")
        n = check_positive_int(num_spatial_dims, "num_spatial_dims")
        self.num_spatial_dims = n
        self.target_shape = as_tuple(target_shape, n, "target_shape")
        self.operation = operation
        if bins not in ("equinox", "torch"):
            raise ValueError(f"`bins` must be 'equinox' or 'torch', got {bins!r}.")
        self.bins = bins

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
            x = _pool_axis(x, axis, out, self.operation, self.bins)
        return x


class _AdaptiveAvgPool(AdaptivePool):
    def __call__(self, x: PoolInput, *, key: PRNGKeyArray | None = None) -> PoolOutput:
        """**Arguments:**

        - `x`: a single example of shape `(channels, *spatial)` (an integer input
          is averaged in the default float dtype, as in Equinox).
          Batch with `jax.vmap`.
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(channels, *target_shape)`.
        """
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(default_floating_dtype())  # as Equinox: a float average
        return super().__call__(x, key=key)


class AdaptiveAvgPool1d(_AdaptiveAvgPool):
    """Adaptive average pooling of `(channels, length)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int], *, bins: str = "equinox"):
        """**Arguments:**

        - `target_shape`: the output length (an int or a sequence of one int).
        - `bins`: `"equinox"` (default) or `"torch"`, see `AdaptivePool`.
        """
        AdaptivePool.__init__(self, target_shape, 1, jnp.mean, bins=bins)


class AdaptiveAvgPool2d(_AdaptiveAvgPool):
    """Adaptive average pooling of `(channels, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int], *, bins: str = "equinox"):
        """**Arguments:**

        - `target_shape`: the output `(height, width)`; an int for both.
        - `bins`: `"equinox"` (default) or `"torch"`, see `AdaptivePool`.
        """
        AdaptivePool.__init__(self, target_shape, 2, jnp.mean, bins=bins)


class AdaptiveAvgPool3d(_AdaptiveAvgPool):
    """Adaptive average pooling of `(channels, depth, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int], *, bins: str = "equinox"):
        """**Arguments:**

        - `target_shape`: the output `(depth, height, width)`; an int for all three.
        - `bins`: `"equinox"` (default) or `"torch"`, see `AdaptivePool`.
        """
        AdaptivePool.__init__(self, target_shape, 3, jnp.mean, bins=bins)


class AdaptiveMaxPool1d(AdaptivePool):
    """Adaptive max pooling of `(channels, length)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int], *, bins: str = "equinox"):
        """**Arguments:**

        - `target_shape`: the output length (an int or a sequence of one int).
        - `bins`: `"equinox"` (default) or `"torch"`, see `AdaptivePool`.
        """
        super().__init__(target_shape, 1, jnp.max, bins=bins)


class AdaptiveMaxPool2d(AdaptivePool):
    """Adaptive max pooling of `(channels, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int], *, bins: str = "equinox"):
        """**Arguments:**

        - `target_shape`: the output `(height, width)`; an int for both.
        - `bins`: `"equinox"` (default) or `"torch"`, see `AdaptivePool`.
        """
        super().__init__(target_shape, 2, jnp.max, bins=bins)


class AdaptiveMaxPool3d(AdaptivePool):
    """Adaptive max pooling of `(channels, depth, height, width)` inputs."""

    _name_fields = ("target_shape",)

    def __init__(self, target_shape: int | Sequence[int], *, bins: str = "equinox"):
        """**Arguments:**

        - `target_shape`: the output `(depth, height, width)`; an int for all three.
        - `bins`: `"equinox"` (default) or `"torch"`, see `AdaptivePool`.
        """
        super().__init__(target_shape, 3, jnp.max, bins=bins)
