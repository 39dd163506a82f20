"""Private helpers shared by the convolution and pooling layers.

Argument normalisation (int-or-sequence to tuples, padding specifications), padding
arithmetic, spatial axis names for error messages, and parameter initialisation.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._init import uniform as fast_uniform

PADDING_STRINGS = ("SAME", "SAME_LOWER", "VALID")
PADDING_MODES = ("ZEROS", "REFLECT", "REPLICATE", "CIRCULAR")
# `jnp.pad` mode for each non-zero `padding_mode`.
JNP_PAD_MODES = {"REFLECT": "reflect", "REPLICATE": "edge", "CIRCULAR": "wrap"}

Padding = str | tuple[tuple[int, int], ...]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """`value` as an `int`, or `ValueError` naming the argument `name`."""
    if not _is_int(value) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return int(value)


def as_tuple(value: Any, n: int, name: str, *, minimum: int = 1) -> tuple[int, ...]:
    """Normalise an int or a length-`n` sequence of ints to a tuple of `n` ints."""
    if _is_int(value):
        out = (int(value),) * n
    elif (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == n
        and all(_is_int(v) for v in value)
    ):
        out = tuple(int(v) for v in value)
    else:
        raise ValueError(
            f"`{name}` must be an int or a sequence of {n} ints (one per spatial "
            f"dimension), got {value!r}."
        )
    if any(v < minimum for v in out):
        raise ValueError(f"`{name}` must be >= {minimum} everywhere, got {value!r}.")
    return out


def _is_pair(p: Any) -> bool:
    return (
        isinstance(p, Sequence)
        and not isinstance(p, str)
        and len(p) == 2
        and all(_is_int(v) for v in p)
    )


def parse_padding(padding: Any, n: int, *, strings: bool = True) -> Padding:
    """Normalise a padding specification.

    Returns one of `"SAME"`, `"SAME_LOWER"`, `"VALID"` (only if `strings`), or a tuple
    of `n` `(low, high)` pairs of non-negative ints.
    """
    allowed = "a string ('SAME', 'SAME_LOWER', 'VALID'), " if strings else ""
    if isinstance(padding, str):
        upper = padding.upper()
        if strings and upper in PADDING_STRINGS:
            return upper
        raise ValueError(
            f"`padding` must be {allowed}an int, a sequence of {n} ints or a sequence "
            f"of {n} (low, high) pairs, got {padding!r}."
        )
    if _is_int(padding):
        pairs = ((int(padding), int(padding)),) * n
    elif isinstance(padding, Sequence) and len(padding) == n:
        if all(_is_int(p) for p in padding):
            pairs = tuple((int(p), int(p)) for p in padding)
        elif all(_is_pair(p) for p in padding):
            pairs = tuple((int(lo), int(hi)) for lo, hi in padding)
        else:
            pairs = None
    else:
        pairs = None
    if pairs is None:
        raise ValueError(
            f"`padding` must be {allowed}an int, a sequence of {n} ints or a sequence "
            f"of {n} (low, high) pairs, got {padding!r}."
        )
    if any(v < 0 for pair in pairs for v in pair):
        raise ValueError(f"`padding` must be non-negative, got {padding!r}.")
    return pairs


def parse_padding_mode(padding_mode: Any) -> str:
    """Upper-case `padding_mode` and check it is one of `PADDING_MODES`."""
    upper = padding_mode.upper() if isinstance(padding_mode, str) else None
    if upper not in PADDING_MODES:
        raise ValueError(
            "`padding_mode` must be one of 'ZEROS', 'REFLECT', 'REPLICATE' or "
            f"'CIRCULAR', got {padding_mode!r}."
        )
    return upper


def same_padding(
    size: int, kernel: int, stride: int, dilation: int, *, lower: bool
) -> tuple[int, int]:
    """`(low, high)` padding giving `ceil(size / stride)` outputs; odd extra at the end
    (or at the start when `lower`)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + dilation * (kernel - 1) + 1 - size, 0)
    low = (total + 1) // 2 if lower else total // 2
    return low, total - low


def resolve_padding(
    padding: Padding,
    spatial: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
) -> tuple[tuple[int, int], ...]:
    """Explicit `(low, high)` pairs for a convolution over `spatial`."""
    if padding == "VALID":
        return ((0, 0),) * len(spatial)
    if isinstance(padding, str):
        lower = padding == "SAME_LOWER"
        return tuple(
            same_padding(n, k, s, d, lower=lower)
            for n, k, s, d in zip(spatial, kernel, stride, dilation)
        )
    return padding


def spatial_names(n: int) -> tuple[str, ...]:
    """Names of the spatial axes shown in shape errors."""
    return {
        1: ("length",),
        2: ("height", "width"),
        3: ("depth", "height", "width"),
    }.get(n, tuple(f"dim_{i}" for i in range(1, n + 1)))


def check_window_fits(
    name: str,
    spatial: Sequence[int],
    padding: Sequence[tuple[int, int]],
    window: Sequence[int],
) -> None:
    """`ValueError` if the (dilated) window is larger than the padded input."""
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(spatial, padding))
    if any(p < w for p, w in zip(padded, window)):
        raise ValueError(
            f"{name}: the input's spatial shape {tuple(spatial)} padded to {padded} is "
            f"smaller than the window {tuple(window)}; use a larger input or more "
            "padding."
        )


def default_dtype() -> Any:
    """`float32`, or `float64` when JAX runs with `jax_enable_x64`."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def float_dtype(dtype: Any, layer: str = "Conv") -> Any:
    """Check `dtype` is floating-point or complex (default: `default_dtype()`)."""
    if dtype is None:
        return default_dtype()
    if not jnp.issubdtype(dtype, jnp.inexact):
        shown = getattr(dtype, "__name__", None) or str(dtype)
        raise ValueError(
            f"{layer}: `dtype` must be a floating-point or complex dtype such as "
            f"jnp.float32, got {shown}."
        )
    return jax.dtypes.canonicalize_dtype(dtype)  # float64 -> float32 without x64


def uniform(key: Any, shape: tuple[int, ...], dtype: Any, bound: float) -> jax.Array:
    """Samples from `U(-bound, bound)` (complex: real and imaginary parts drawn
    independently)."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        from ._defaults import uniform_init

        return uniform_init(key, shape, dtype, bound)
    return fast_uniform(key, shape, dtype, -bound, bound)


def fan_in_bound(channels_per_group: int, kernel_size: Sequence[int]) -> float:
    """PyTorch's default bound `1 / sqrt(fan_in)` for weight and bias."""
    return 1.0 / math.sqrt(channels_per_group * math.prod(kernel_size))


def promote(x: Any, weight: Any, name: str) -> Any:
    """The dtype to compute in: JAX's promotion of the input's and the weight's
    dtypes, under the current `jax_numpy_dtype_promotion` setting.

    Raises `TypeError` naming the layer if that setting forbids the promotion.
    """
    try:
        return jnp.result_type(x, weight)
    except jax.dtypes.TypePromotionError as e:
        wanted = jnp.dtype(jnp.result_type(weight)).name
        raise TypeError(
            f"{name}: cannot combine an input of dtype {jnp.result_type(x).name} with "
            f"the layer's {wanted} weight under strict dtype promotion; cast the "
            f"input with `x.astype(jnp.{wanted})`."
        ) from e
