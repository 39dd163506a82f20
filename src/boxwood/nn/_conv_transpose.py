"""Transposed convolutions: `ConvTranspose` and its 1d/2d/3d specialisations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from .._init import Initializer
from .._module import field
from ._conv import ConvBase, ConvInput, ConvOutput, PaddingArg
from ._conv_utils import as_tuple, same_padding
from ._input_checks import layer_name


class ConvTranspose(ConvBase):
    """General N-dimensional transposed convolution.

    Same signature as `equinox.nn.ConvTranspose`. `kernel_size`, `stride`,
    `padding`, `dilation` and `groups` are those of the [`boxwood.nn.Conv`][] being
    reversed (a `Conv` from `out_channels` to `in_channels` channels), and the output
    shape is that `Conv`'s input shape; with explicit padding this is PyTorch's
    `ConvTranspose` rule
    `(n - 1) * stride - low - high + dilation * (kernel - 1) + 1 + output_padding`.
    With `"SAME"` / `"SAME_LOWER"` padding the output size is
    `n * stride - output_padding`.

    **Weight layout.** `weight` has shape `(out_channels, in_channels // groups,
    *kernel_size)` and is applied as an ordinary convolution kernel to the
    stride-dilated, padded input. A PyTorch `ConvTranspose` weight `w_t` of shape
    `(in_channels, out_channels // groups, *kernel_size)` converts as:

    ```python
    g = groups
    w = w_t.reshape(g, in_channels // g, out_channels // g, *kernel_size)
    w = w.swapaxes(1, 2).reshape(out_channels, in_channels // g, *kernel_size)
    w = jnp.flip(w, axis=tuple(range(2, w.ndim)))  # flip the spatial axes
    ```

    For `groups=1` this is `jnp.flip(w_t, spatial axes).swapaxes(0, 1)`; the same
    formula turns a `Conv` weight into the weight of its exact linear transpose.
    """

    output_padding: tuple[int, ...] = field(static=True)

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingArg = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        As for [`boxwood.nn.Conv`][], describing the equivalent forward `Conv`, plus:

        - `output_padding`: an int or a sequence of `num_spatial_dims` ints, each
          smaller than the stride. A strided `Conv` maps several input sizes to the
          same output size; this picks a larger one (explicit padding: extra padding
          at the end; `"SAME"` padding: it reduces the output size).
        - `padding_mode`: `"ZEROS"`, or `"CIRCULAR"` (the exact transpose of a
          circular `Conv`; only with `"SAME"` / `"SAME_LOWER"` padding and
          `output_padding=0`).

        Weight and bias are drawn from `U(-1/sqrt(fan_in), 1/sqrt(fan_in))` with
        `fan_in = out_channels // groups * prod(kernel_size)`: PyTorch's default
        (PyTorch computes `fan_in` from its weight's second axis, which is
        `out_channels // groups` for transposed convolutions; Equinox uses
        `in_channels // groups` instead).
        """
        self._set_channels(num_spatial_dims, in_channels, out_channels, groups)
        self._set_window(kernel_size, stride, padding, dilation, padding_mode)
        self.use_bias = bool(use_bias)
        n = self.num_spatial_dims
        self.output_padding = as_tuple(output_padding, n, "output_padding", minimum=0)
        if any(a >= s for a, s in zip(self.output_padding, self.stride)):
            raise ValueError(
                "`output_padding` must be smaller than `stride` in every dimension, got "
                f"output_padding={self.output_padding} and stride={self.stride}."
            )
        self._check_mode()
        fan_in = self.out_channels // self.groups
        self._init_params(key, dtype, fan_in, weight_init, bias_init)

    def _check_mode(self) -> None:
        name = layer_name(self, *self._name_fields)
        if self.padding_mode in ("REFLECT", "REPLICATE"):
            raise NotImplementedError(
                f"{name}: `padding_mode={self.padding_mode!r}` is not "
                "supported; use 'ZEROS' or 'CIRCULAR'."
            )
        if self.padding_mode == "CIRCULAR" and (
            self.padding not in ("SAME", "SAME_LOWER") or any(self.output_padding)
        ):
            raise NotImplementedError(
                f"{name}: `padding_mode='CIRCULAR'` needs `padding='SAME'` or "
                f"'SAME_LOWER' and `output_padding=0`, got padding={self.padding!r} and "
                f"output_padding={self.output_padding}."
            )

    def _transpose_padding(self, spatial: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Padding of the stride-dilated input that gives the output size."""
        pads = []
        config = zip(self.kernel_size, self.stride, self.dilation, self.output_padding)
        for i, (m, (k, s, d, a)) in enumerate(zip(spatial, config)):
            span = d * (k - 1)
            if isinstance(self.padding, str) and self.padding != "VALID":
                size = m * s - a
                low, _ = same_padding(size, k, s, d, lower=self.padding == "SAME_LOWER")
            else:
                low, high = (0, 0) if self.padding == "VALID" else self.padding[i]
                size = (m - 1) * s - low - high + span + 1 + a
            if size < 1:
                raise ValueError(
                    f"{layer_name(self, *self._name_fields)}: input spatial shape "
                    f"{tuple(spatial)} gives an empty output; use a larger input or "
                    "less padding."
                )
            low_t = span - low
            pads.append((low_t, size - 1 - (m - 1) * s + span - low_t))
        return tuple(pads)

    def __call__(self, x: ConvInput, *, key: PRNGKeyArray | None = None) -> ConvOutput:
        """**Arguments:**

        - `x`: a single example of shape `(in_channels, *spatial)`. Batch with
          `jax.vmap`. It is combined with the weight under JAX's dtype promotion
          rules (with `jax_numpy_dtype_promotion="strict"`, give it the weight's
          dtype).
        - `key`: ignored; accepted for API compatibility. (Keyword only argument.)

        **Returns:**

        An array of shape `(out_channels, *new_spatial)`.
        """
        del key
        x, weight = self._checked(x)
        pads = self._transpose_padding(x.shape[1:])
        if self.padding_mode == "CIRCULAR":
            # Periodic input of period `stride * n`: wrap whole (undilated) elements,
            # then zero-pad the remainder, which lies between dilated elements.
            wraps = [(lo // s, hi // s) for (lo, hi), s in zip(pads, self.stride)]
            x = jnp.pad(x, ((0, 0), *wraps), mode="wrap")
            pads = tuple((lo % s, hi % s) for (lo, hi), s in zip(pads, self.stride))
        y = lax.conv_general_dilated(
            x[None],
            weight,
            window_strides=(1,) * self.num_spatial_dims,
            padding=pads,
            lhs_dilation=self.stride,
            rhs_dilation=self.dilation,
            feature_group_count=self.groups,
        )
        return self._add_bias(y[0])


# Note: as in Equinox, the 1d/2d/3d transposed convolutions take `output_padding`
# *before* `padding` positionally (the general `ConvTranspose` takes it after).


class ConvTranspose1d(ConvTranspose):
    """One-dimensional [`boxwood.nn.ConvTranspose`][]: input `(in_channels, length)`.

    Positionally `output_padding` comes before `padding` (as in Equinox); pass both
    by keyword to avoid confusion.
    """

    _name_fields = ("in_channels",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        output_padding: int | Sequence[int] = 0,
        padding: PaddingArg = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        key: PRNGKeyArray,
    ):
        """Arguments as for [`boxwood.nn.ConvTranspose`][], without
        `num_spatial_dims`."""
        super().__init__(
            1,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
        )


class ConvTranspose2d(ConvTranspose):
    """Two-dimensional [`boxwood.nn.ConvTranspose`][]: input `(in_channels, height,
    width)`.

    Positionally `output_padding` comes before `padding` (as in Equinox); pass both
    by keyword to avoid confusion.
    """

    _name_fields = ("in_channels",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        output_padding: int | Sequence[int] = 0,
        padding: PaddingArg = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        key: PRNGKeyArray,
    ):
        """Arguments as for [`boxwood.nn.ConvTranspose`][], without
        `num_spatial_dims`."""
        super().__init__(
            2,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
        )


class ConvTranspose3d(ConvTranspose):
    """Three-dimensional [`boxwood.nn.ConvTranspose`][]: input `(in_channels, depth,
    height, width)`.

    Positionally `output_padding` comes before `padding` (as in Equinox); pass both
    by keyword to avoid confusion.
    """

    _name_fields = ("in_channels",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        output_padding: int | Sequence[int] = 0,
        padding: PaddingArg = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        key: PRNGKeyArray,
    ):
        """Arguments as for [`boxwood.nn.ConvTranspose`][], without
        `num_spatial_dims`."""
        super().__init__(
            3,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
        )
