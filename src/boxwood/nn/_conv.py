"""Convolutions: `Conv` and its 1d/2d/3d specialisations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import Initializer, check_initializer, init_param, split_keys
from .._module import Module, field
from ._conv_utils import (
    JNP_PAD_MODES,
    Padding,
    as_tuple,
    check_positive_int,
    check_window_fits,
    fan_in_bound,
    float_dtype,
    parse_padding,
    parse_padding_mode,
    promote,
    resolve_padding,
    spatial_names,
    uniform,
)
from ._input_checks import check_input, layer_name

PaddingArg = str | int | Sequence[int] | Sequence[tuple[int, int]]
# jaxtyping shapes (module-level aliases keep linters from parsing them as code).
ConvWeight = Float[Array, "out_channels in_per_group *kernel_size"]
ConvBias = Float[Array, "out_channels *ones"]
ConvInput = Float[Array, "in_channels *spatial"]
ConvOutput = Float[Array, "out_channels *new_spatial"]


class ConvBase(Module):
    """Fields and checks shared by `Conv` and `ConvTranspose`."""

    weight: ConvWeight
    bias: ConvBias | None
    num_spatial_dims: int = field(static=True)
    in_channels: int = field(static=True)
    out_channels: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: Padding = field(static=True)
    dilation: tuple[int, ...] = field(static=True)
    groups: int = field(static=True)
    use_bias: bool = field(static=True)
    padding_mode: str = field(static=True)

    # Static fields shown in error messages; the 1d/2d/3d classes drop the first.
    _name_fields = ("num_spatial_dims", "in_channels")
    # how an initialiser sees each parameter (boxwood._init._layout)
    _init_layouts = {"weight": "conv", "bias": "channel_bias"}

    def _set_channels(self, n, in_channels, out_channels, groups):
        """The channel fields, checked (`groups` must divide both channel counts)."""
        self.num_spatial_dims = check_positive_int(n, "num_spatial_dims")
        self.in_channels = check_positive_int(in_channels, "in_channels")
        self.out_channels = check_positive_int(out_channels, "out_channels")
        self.groups = check_positive_int(groups, "groups")
        for arg, channels in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
        ):
            if channels % groups:
                raise ValueError(
                    f"`groups` must divide `{arg}`, got {arg}={channels} and "
                    f"groups={groups}."
                )

    def _set_window(self, kernel_size, stride, padding, dilation, padding_mode):
        """The sliding window's fields (after `_set_channels`)."""
        n = self.num_spatial_dims
        self.kernel_size = as_tuple(kernel_size, n, "kernel_size")
        self.stride = as_tuple(stride, n, "stride")
        self.dilation = as_tuple(dilation, n, "dilation")
        self.padding = parse_padding(padding, n)
        self.padding_mode = parse_padding_mode(padding_mode)

    def _init_params(
        self,
        key: PRNGKeyArray,
        dtype: Any,
        fan_in_channels: int,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ) -> None:
        name = type(self).__name__
        check_initializer(weight_init, "weight_init", name)
        check_initializer(bias_init, "bias_init", name)
        dtype = float_dtype(dtype, name)
        bound = fan_in_bound(fan_in_channels, self.kernel_size)
        wkey, bkey = split_keys(key)
        wshape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        self.weight = init_param(
            weight_init,
            lambda: uniform(wkey, wshape, dtype, bound),
            *(wkey, wshape, dtype, "weight_init", name, "conv"),
        )
        bshape = (self.out_channels,) + (1,) * self.num_spatial_dims
        self.bias = (
            init_param(
                bias_init,
                lambda: uniform(bkey, bshape, dtype, bound),
                *(bkey, bshape, dtype, "bias_init", name, "channel_bias"),
            )
            if self.use_bias
            else None
        )

    def _checked(self, x: Any) -> tuple[Array, Array]:
        """The input, checked, and the weight, both in the dtype to compute in."""
        name = layer_name(self, *self._name_fields)
        x = jnp.asarray(x)
        expected = (self.in_channels, *spatial_names(self.num_spatial_dims))
        check_input(x, expected, name)
        dtype = promote(x, self.weight, name)
        return x.astype(dtype), self.weight.astype(dtype)

    def _add_bias(self, y: Array) -> Array:
        return y if self.bias is None else y + self.bias.astype(y.dtype)


class Conv(ConvBase):
    """General N-dimensional convolution (cross-correlation, as in PyTorch).

    Same signature as `equinox.nn.Conv`. `weight` has PyTorch's layout
    `(out_channels, in_channels // groups, *kernel_size)`; `bias` (or `None`) has
    shape `(out_channels, 1, ..., 1)`.
    """

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
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
        """**Arguments:**

        - `num_spatial_dims`: the number of spatial dimensions (2 for images).
        - `in_channels`, `out_channels`: the number of input and output channels.
        - `kernel_size`, `stride`, `dilation`: an int (the same for every spatial
          dimension) or a sequence of `num_spatial_dims` ints.
        - `padding`: an int, a sequence of `num_spatial_dims` ints, a sequence of
          `num_spatial_dims` `(low, high)` pairs, or one of the strings `"VALID"` (no
          padding), `"SAME"` / `"SAME_LOWER"` (pad so that each output size is
          `ceil(input_size / stride)`; an odd total is padded one more at the end for
          `"SAME"`, at the start for `"SAME_LOWER"`).
        - `groups`: split the channels into this many independent groups; must divide
          both `in_channels` and `out_channels`.
        - `use_bias`: whether to add a bias.
        - `padding_mode`: the padded values: `"ZEROS"` (`1234 -> 00123400`),
          `"REFLECT"` (`32123432`), `"REPLICATE"` (`11123444`) or `"CIRCULAR"`
          (`34123412`). Case-insensitive.
        - `dtype`: the parameters' floating-point dtype (default float32, or float64
          when `jax_enable_x64` is on).
        - `weight_init`, `bias_init`: optional `(key, shape, dtype) -> array`
          functions (any `jax.nn.initializers` function) for the weight and the bias.
          As in JAX and Flax, the weight's is called with shape
          `(*kernel_size, in_channels // groups, out_channels)` and its result is
          stored as `(out_channels, in_channels // groups, *kernel_size)`; the
          bias's is called with `(out_channels,)`. (Keyword only.)
        - `key`: a PRNG key for the initialisation. (Keyword only argument.)

        By default weight and bias are drawn from `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`
        with `fan_in = in_channels // groups * prod(kernel_size)`, PyTorch's default.
        """
        self._set_channels(num_spatial_dims, in_channels, out_channels, groups)
        self._set_window(kernel_size, stride, padding, dilation, padding_mode)
        self.use_bias = bool(use_bias)
        self._init_params(
            key, dtype, self.in_channels // self.groups, weight_init, bias_init
        )

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
        spatial = x.shape[1:]
        pads = resolve_padding(
            self.padding, spatial, self.kernel_size, self.stride, self.dilation
        )
        window = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))
        check_window_fits(layer_name(self, *self._name_fields), spatial, pads, window)
        if self.padding_mode != "ZEROS":
            x = jnp.pad(x, ((0, 0), *pads), mode=JNP_PAD_MODES[self.padding_mode])
            pads = ((0, 0),) * self.num_spatial_dims
        y = lax.conv_general_dilated(
            x[None],
            weight,
            window_strides=self.stride,
            padding=pads,
            rhs_dilation=self.dilation,
            feature_group_count=self.groups,
        )
        return self._add_bias(y[0])


class Conv1d(Conv):
    """One-dimensional [`boxwood.nn.Conv`][]: input `(in_channels, length)`."""

    _name_fields = ("in_channels",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
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
        """Arguments as for [`boxwood.nn.Conv`][], without `num_spatial_dims`."""
        super().__init__(
            1,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
        )


class Conv2d(Conv):
    """Two-dimensional [`boxwood.nn.Conv`][]: input `(in_channels, height, width)`."""

    _name_fields = ("in_channels",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
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
        """Arguments as for [`boxwood.nn.Conv`][], without `num_spatial_dims`."""
        super().__init__(
            2,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
        )


class Conv3d(Conv):
    """Three-dimensional [`boxwood.nn.Conv`][]: input `(in_channels, depth, height,
    width)`."""

    _name_fields = ("in_channels",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
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
        """Arguments as for [`boxwood.nn.Conv`][], without `num_spatial_dims`."""
        super().__init__(
            3,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            weight_init=weight_init,
            bias_init=bias_init,
            key=key,
        )
