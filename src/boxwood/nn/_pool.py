"""Sliding-window pooling: `Pool`, `MaxPool1d/2d/3d` and `AvgPool1d/2d/3d`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray, Shaped

from .._module import Module, field
from ._conv_utils import (
    as_tuple,
    check_positive_int,
    check_window_fits,
    parse_padding,
    spatial_names,
)
from ._defaults import default_floating_dtype
from ._input_checks import check_input, layer_name

# jaxtyping shapes (module-level aliases keep linters from parsing them as code).
PoolInput = Shaped[Array, "channels *spatial"]
PoolOutput = Shaped[Array, "channels *new_spatial"]
_PaddingArg = int | Sequence[int] | Sequence[tuple[int, int]]


def _pooled_size(size: int, k: int, s: int, lo: int, hi: int, ceil: bool) -> int:
    """PyTorch's output size; in ceil mode a window starting in the right padding
    (or beyond) is dropped."""
    span = size + lo + hi - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + lo:
        out -= 1
    return out


class Pool(Module):
    """General N-dimensional downsampling over a sliding window.

    Same signature as `equinox.nn.Pool`. Windows are `kernel_size` wide and move by
    `stride`; the input is padded with `init`. `use_ceil=True` follows PyTorch's
    `ceil_mode=True`: one more window is kept when the last one would be partial,
    unless it would start in the right padding (where Equinox differs).
    """

    init: int | float = field(static=True)
    equinox_scalar_fields = ("init",)  # a record in Equinox .eqx files
    operation: Callable[[Array, Array], Array] = field(static=True)
    num_spatial_dims: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: tuple[tuple[int, int], ...] = field(static=True)
    use_ceil: bool = field(static=True)

    # Static fields shown in error messages; the 1d/2d/3d classes drop the first.
    _name_fields = ("num_spatial_dims", "kernel_size")

    def __init__(
        self,
        init: int | float | Array,
        operation: Callable[[Array, Array], Array],
        num_spatial_dims: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """**Arguments:**

        - `init`: the reduction's initial value, also used as the padding value; a
          Python number (or a scalar array, converted to one). For `Pool` to be
          differentiable, `operation(init, x) == x` must hold.
        - `operation`: the binary reduction applied within each window, such as
          `jax.lax.max` or `jax.lax.add`.
        - `num_spatial_dims`: the number of spatial dimensions.
        - `kernel_size`: the window size; an int or a sequence of `num_spatial_dims`
          ints.
        - `stride`: how far the window moves; an int or a sequence. Defaults to `1`
          (as in Equinox; PyTorch's pools default to `stride=kernel_size`).
        - `padding`: an int, a sequence of `num_spatial_dims` ints, or a sequence of
          `(low, high)` pairs; at most `kernel_size` on each side.
        - `use_ceil`: round the number of windows up rather than down (PyTorch's
          `ceil_mode`).
        """
        if not callable(operation):
            raise ValueError(f"`operation` must be callable, got {operation!r}.")
        self.init = init if isinstance(init, (int, float)) else np.asarray(init).item()
        self.operation = operation
        n = self.num_spatial_dims = check_positive_int(
            num_spatial_dims, "num_spatial_dims"
        )
        self.kernel_size = as_tuple(kernel_size, n, "kernel_size")
        self.stride = as_tuple(stride, n, "stride")
        self.padding = cast(tuple, parse_padding(padding, n, strings=False))
        if any(max(p) > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(
                "`padding` must be at most `kernel_size` on each side, got "
                f"padding={self.padding} and kernel_size={self.kernel_size}."
            )
        self.use_ceil = bool(use_ceil)

    def _name(self) -> str:
        return layer_name(self, *self._name_fields)

    def _checked(self, x: Any) -> Array:
        x = jnp.asarray(x)
        expected = ("channels", *spatial_names(self.num_spatial_dims))
        check_input(x, expected, self._name())
        return x

    def _window_padding(self, spatial: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The padding to give `lax.reduce_window`, extended on the right in ceil
        mode so that it produces PyTorch's number of windows."""
        check_window_fits(self._name(), spatial, self.padding, self.kernel_size)
        if not self.use_ceil:
            return self.padding
        pads = []
        for n, k, s, (lo, hi) in zip(
            spatial, self.kernel_size, self.stride, self.padding
        ):
            out = _pooled_size(n, k, s, lo, hi, ceil=True)
            pads.append((lo, max(hi, (out - 1) * s + k - n - lo)))
        return tuple(pads)

    def _reduce(self, x: Array, init: Any, operation: Callable) -> Array:
        """`lax.reduce_window` over the spatial axes of `x`. On a TPU a leading
        axis of size one is added for the reduction and dropped after it: there
        the gradient of a maximum (XLA's select-and-scatter) is unimplemented
        unless two axes of its operand are outside every window, which a lone
        `(channels, length)` or `(channels, height, width)` example lacks. (The
        axis changes no value; on a CPU it made a batched pool's gradient about
        15% slower, so it is left out there.)"""
        pads = self._window_padding(x.shape[1:])
        lead = 2 if jax.default_backend() == "tpu" else 1  # axes outside the windows
        out = lax.reduce_window(
            x.reshape((1,) * (lead - 1) + x.shape),
            np.asarray(init, x.dtype),  # concrete: keeps it differentiable
            operation,
            (1,) * lead + self.kernel_size,
            (1,) * lead + self.stride,
            ((0, 0),) * lead + tuple(pads),
        )
        return out.reshape(out.shape[lead - 1 :])

    def __call__(self, x: PoolInput, *, key: PRNGKeyArray | None = None) -> PoolOutput:
        """**Arguments:**

        - `x`: a single example of shape `(channels, *spatial)`. Batch with
          `jax.vmap`.
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(channels, *new_spatial)`.
        """
        del key
        x = self._checked(x)
        return self._reduce(x, self.init, self.operation)


class _MaxPool(Pool):
    """Maximum over each window; padding never wins (it is `-inf`)."""

    def __init__(self, num_spatial_dims, kernel_size, stride, padding, use_ceil):
        super().__init__(
            -math.inf,
            lax.max,
            num_spatial_dims,
            kernel_size,
            stride,
            padding,
            use_ceil,
        )

    def __call__(self, x: PoolInput, *, key: PRNGKeyArray | None = None) -> PoolOutput:
        """**Arguments:**

        - `x`: a single example of shape `(channels, *spatial)`. Batch with
          `jax.vmap`.
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(channels, *new_spatial)`.
        """
        del key
        x = self._checked(x)
        dtype = x.dtype
        lowest = (
            -jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min
        )
        return self._reduce(x, lowest, lax.max)


class _AvgPool(Pool):
    """Mean over each window; padding counts as zeros (PyTorch's
    `count_include_pad=True`), except the extra right padding added by ceil mode."""

    def __init__(self, num_spatial_dims, kernel_size, stride, padding, use_ceil):
        super().__init__(
            0, lax.add, num_spatial_dims, kernel_size, stride, padding, use_ceil
        )

    def _counts(self, spatial: Sequence[int]) -> np.ndarray:
        """Window sizes, clipped to the padded input (smaller only in ceil mode)."""
        counts = np.ones((1,), np.float64)
        for n, k, s, (lo, hi) in zip(
            spatial, self.kernel_size, self.stride, self.padding
        ):
            out = _pooled_size(n, k, s, lo, hi, self.use_ceil)
            starts = np.arange(out) * s - lo
            sizes = np.minimum(starts + k, n + hi) - starts
            counts = np.multiply.outer(counts, sizes)
        return counts

    def __call__(self, x: PoolInput, *, key: PRNGKeyArray | None = None) -> PoolOutput:
        """**Arguments:**

        - `x`: a single example of shape `(channels, *spatial)` (an integer input
          is averaged in the default float dtype, as in Equinox).
          Batch with `jax.vmap`.
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(channels, *new_spatial)`.
        """
        del key
        x = self._checked(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(default_floating_dtype())  # as Equinox: a float average
        dtype = x.dtype
        # Sum low-precision inputs in float32, as PyTorch does.
        acc = jnp.float32 if jnp.finfo(dtype).bits < 32 else dtype
        total = self._reduce(x.astype(acc), 0, lax.add)
        counts = jnp.asarray(self._counts(x.shape[1:]), acc)
        return (total / counts).astype(dtype)


class MaxPool1d(_MaxPool):
    """One-dimensional max pooling of `(channels, length)` inputs."""

    _name_fields = ("kernel_size",)

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """Arguments as for [`boxwood.nn.Pool`][] (`kernel_size`, `stride` (default
        `1`, unlike PyTorch), `padding`, `use_ceil`)."""
        super().__init__(1, kernel_size, stride, padding, use_ceil)


class MaxPool2d(_MaxPool):
    """Two-dimensional max pooling of `(channels, height, width)` inputs."""

    _name_fields = ("kernel_size",)

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """Arguments as for [`boxwood.nn.Pool`][] (`kernel_size`, `stride` (default
        `1`, unlike PyTorch), `padding`, `use_ceil`)."""
        super().__init__(2, kernel_size, stride, padding, use_ceil)


class MaxPool3d(_MaxPool):
    """Three-dimensional max pooling of `(channels, depth, height, width)` inputs."""

    _name_fields = ("kernel_size",)

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """Arguments as for [`boxwood.nn.Pool`][] (`kernel_size`, `stride` (default
        `1`, unlike PyTorch), `padding`, `use_ceil`)."""
        super().__init__(3, kernel_size, stride, padding, use_ceil)


class AvgPool1d(_AvgPool):
    """One-dimensional average pooling of `(channels, length)` inputs.

    Padding counts as zeros in the average (PyTorch's `count_include_pad=True`). In
    ceil mode a window that runs past the padded input is averaged over the part
    inside it, as in PyTorch (Equinox divides by the full window size).
    """

    _name_fields = ("kernel_size",)

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """Arguments as for [`boxwood.nn.Pool`][] (`kernel_size`, `stride` (default
        `1`, unlike PyTorch), `padding`, `use_ceil`)."""
        super().__init__(1, kernel_size, stride, padding, use_ceil)


class AvgPool2d(_AvgPool):
    """Two-dimensional average pooling of `(channels, height, width)` inputs.

    Padding counts as zeros in the average (PyTorch's `count_include_pad=True`). In
    ceil mode a window that runs past the padded input is averaged over the part
    inside it, as in PyTorch (Equinox divides by the full window size).
    """

    _name_fields = ("kernel_size",)

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """Arguments as for [`boxwood.nn.Pool`][] (`kernel_size`, `stride` (default
        `1`, unlike PyTorch), `padding`, `use_ceil`)."""
        super().__init__(2, kernel_size, stride, padding, use_ceil)


class AvgPool3d(_AvgPool):
    """Three-dimensional average pooling of `(channels, depth, height, width)` inputs.

    Padding counts as zeros in the average (PyTorch's `count_include_pad=True`). In
    ceil mode a window that runs past the padded input is averaged over the part
    inside it, as in PyTorch (Equinox divides by the full window size).
    """

    _name_fields = ("kernel_size",)

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: _PaddingArg = 0,
        use_ceil: bool = False,
    ):
        """Arguments as for [`boxwood.nn.Pool`][] (`kernel_size`, `stride` (default
        `1`, unlike PyTorch), `padding`, `use_ceil`)."""
        super().__init__(3, kernel_size, stride, padding, use_ceil)
