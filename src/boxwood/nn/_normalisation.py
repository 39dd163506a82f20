"""`LayerNorm`, `RMSNorm`, `GroupNorm`.

Statistics are computed in at least float32 (a `bfloat16`/`float16` input is promoted,
normalised, and cast back), so low-precision models keep stable normalisation.
"""

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import ones, zeros
from .._module import Module, field
from .._shape import as_shape
from .._warnings import user_stacklevel
from ._defaults import compute_dtype, resolve_dtype
from ._input_checks import check_input, layer_name

# (An alias: the string `"channels *spatial"` inside an annotation would be read by
# linters as the Python expression `channels * spatial`.)
_ChannelsFirst = Float[Array, "channels *spatial"]
_NO_STATE = object()


def _with_state(out: Array, state: Any) -> Any:
    return out if state is _NO_STATE else (out, state)


def _affine(out: Array, weight: Array | None, bias: Array | None) -> Array:
    if weight is not None:
        out = out * weight.astype(out.dtype)
    if bias is not None:
        out = out + bias.astype(out.dtype)
    return out


def _standardise(x: Array, eps: float, axis: Any = None) -> Array:
    """`(x - mean) * rsqrt(var + eps)` over `axis`, `var` the population variance.

    The same formula as `jnp.mean` and `jnp.var` computed separately (the values
    agree to the last bit or two: XLA may order the sums differently), but the
    input is centred once, where `jnp.var` centres it a second time with its own
    mean. That second centring (and its gradient) is what made the first training
    step of 12 unrolled transformer blocks compile about twice as long; the nested
    `jit` of `jnp.var` and the clamp of the variance at 0 cost nothing measurable."""
    centred = x - jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.mean(centred * centred, axis=axis, keepdims=True)
    return centred * jax.lax.rsqrt(var + eps)


def _scale_and_shift(
    shape: Any, dtype: Any, scale: bool, shift: bool
) -> tuple[Array | None, Array | None]:
    """The learnt affine parameters: a scale of ones and a shift of zeros, each
    present only when asked for."""
    return (
        ones(shape, dtype) if scale else None,
        zeros(shape, dtype) if shift else None,
    )


def _upcast(x: Any) -> tuple[Array, Any]:
    """`x` as an array in the dtype the statistics are computed in, and its own
    dtype (to cast the result back to)."""
    x = jnp.asarray(x)
    return x.astype(compute_dtype(x.dtype)), x.dtype


def _legacy_affine(elementwise_affine: bool | None, use_weight: bool, use_bias: bool):
    """`(use_weight, use_bias)`, with Equinox's deprecated `elementwise_affine`
    (which sets both) taking precedence when given."""
    if elementwise_affine is None:
        return bool(use_weight), bool(use_bias)
    warnings.warn(
        "LayerNorm(elementwise_affine=...) is deprecated: pass "
        "`use_weight=...` and `use_bias=...` instead.",
        DeprecationWarning,
        stacklevel=user_stacklevel(),
    )
    return bool(elementwise_affine), bool(elementwise_affine)


def _check_eps(eps: Any, name: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"{name}: `eps` must be a non-negative float, got {eps!r}.")
    return float(eps)


class LayerNorm(Module):
    """Normalises its whole input to mean 0 and variance 1, then optionally applies
    an elementwise affine map: `(x - mean) / sqrt(var + eps) * weight + bias`.

    Same signature as `equinox.nn.LayerNorm`; the input's shape must equal `shape`
    (as `torch.nn.LayerNorm(shape)` on one example). The variance is the biased
    (population) variance, as in PyTorch. To normalise over only the trailing axes,
    `jax.vmap` over the leading ones.

    >>> import boxwood.nn, jax.numpy as jnp
    >>> boxwood.nn.LayerNorm(2)(jnp.array([1.0, 3.0])).round(3)
    Array([-1.,  1.], dtype=float32)
    """

    weight: Float[Array, "*shape"] | None
    bias: Float[Array, "*shape"] | None
    shape: tuple[int, ...] = field(static=True)
    eps: float = field(static=True)
    use_weight: bool = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        shape: int | Sequence[int],
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        elementwise_affine: bool | None = None,
    ):
        """**Arguments:**

        - `shape`: the shape of the input (an int means `(shape,)`).
        - `eps`: added to the variance for numerical stability.
        - `use_weight`: whether to learn an elementwise scale (initialised to 1).
        - `use_bias`: whether to learn an elementwise shift (initialised to 0).
        - `dtype`: dtype of the weight and bias. Defaults to `float32`.
        - `elementwise_affine`: deprecated (as in Equinox): sets both `use_weight`
            and `use_bias`, with a `DeprecationWarning`. (Keyword only.)
        """
        flags = _legacy_affine(elementwise_affine, use_weight, use_bias)
        self.use_weight, self.use_bias = flags
        self.shape = as_shape(shape, "LayerNorm")
        self.eps = _check_eps(eps, "LayerNorm")
        dtype = resolve_dtype(dtype, "LayerNorm")
        self.weight, self.bias = _scale_and_shift(self.shape, dtype, *flags)

    def __call__(
        self,
        x: Float[Array, "*shape"],
        state: Any = _NO_STATE,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Any:
        """**Arguments:**

        - `x`: an array of shape `shape`.
        - `state`: optional; passed through unchanged, so that the layer can be
            swapped with [`boxwood.nn.BatchNorm`][] (`y, state = norm(x, state)`).
        - `key`: ignored. (Keyword only.)

        **Returns:**

        An array of the same shape and dtype as `x`; or `(output, state)` if `state`
        was given.
        """
        del key
        check_input(x, self.shape, layer_name(self, "shape"))
        wide, dtype = _upcast(x)
        out = _affine(_standardise(wide, self.eps), self.weight, self.bias)
        return _with_state(out.astype(dtype), state)


class RMSNorm(Module):
    """Rescales its input by its root mean square, then optionally applies an
    elementwise affine map: `x / sqrt(mean(x**2) + eps) * weight + bias`.

    Same signature and defaults as `equinox.nn.RMSNorm`, so the default layer has a
    bias (`use_bias=True`) and the same code builds the same pytree in both. For
    the layer `torch.nn.RMSNorm` computes (no bias), pass `use_bias=False`. Unlike
    PyTorch, whose default `eps=None` means the dtype's machine epsilon, `eps`
    defaults to `1e-5`.

    >>> import boxwood.nn, jax.numpy as jnp
    >>> norm = boxwood.nn.RMSNorm(3)
    >>> norm.bias
    Array([0., 0., 0.], dtype=float32)
    >>> norm(jnp.array([3.0, 4.0, 0.0])).shape
    (3,)
    """

    weight: Float[Array, "*shape"] | None
    bias: Float[Array, "*shape"] | None
    shape: tuple[int, ...] = field(static=True)
    eps: float = field(static=True)
    use_weight: bool = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        shape: int | Sequence[int],
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
    ):
        """**Arguments:**

        - `shape`: the shape of the input (an int means `(shape,)`).
        - `eps`: added to the mean square for numerical stability.
        - `use_weight`: whether to learn an elementwise scale (initialised to 1).
        - `use_bias`: whether to learn an elementwise shift (initialised to 0).
        - `dtype`: dtype of the weight and bias. Defaults to `float32`.
        """
        self.use_weight, self.use_bias = bool(use_weight), bool(use_bias)
        self.shape = as_shape(shape, "RMSNorm")
        self.eps = _check_eps(eps, "RMSNorm")
        dtype = resolve_dtype(dtype, "RMSNorm")
        self.weight, self.bias = _scale_and_shift(
            self.shape, dtype, self.use_weight, self.use_bias
        )

    def __call__(
        self,
        x: Float[Array, "*shape"],
        state: Any = _NO_STATE,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Any:
        """**Arguments:**

        - `x`: an array of shape `shape`.
        - `state`: optional; passed through unchanged, so that the layer can be
            swapped with [`boxwood.nn.BatchNorm`][] (`y, state = norm(x, state)`).
        - `key`: ignored. (Keyword only.)

        **Returns:**

        An array of the same shape and dtype as `x`; or `(output, state)` if `state`
        was given.
        """
        del key
        check_input(x, self.shape, layer_name(self, "shape"))
        wide, dtype = _upcast(x)
        out = wide * jax.lax.rsqrt(jnp.mean(jnp.square(wide)) + self.eps)
        return _with_state(_affine(out, self.weight, self.bias).astype(dtype), state)


class GroupNorm(Module):
    """Splits the channels (first axis) into `groups` groups and normalises each group
    to mean 0 and variance 1, then optionally applies a per-channel affine map.

    Same signature as `equinox.nn.GroupNorm`; on an input of shape
    `(channels, *spatial)` it computes what `torch.nn.GroupNorm` computes on one
    example.
    """

    weight: Float[Array, " channels"] | None
    bias: Float[Array, " channels"] | None
    groups: int = field(static=True)
    channels: int | None = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)

    def __init__(
        self,
        groups: int,
        channels: int | None = None,
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        dtype: Any = None,
    ):
        """**Arguments:**

        - `groups`: the number of groups; must divide the number of channels.
        - `channels`: the number of channels. May be `None` only if
            `channelwise_affine=False`.
        - `eps`: added to the variance for numerical stability.
        - `channelwise_affine`: whether to learn a per-channel scale (initialised to
            1) and shift (initialised to 0).
        - `dtype`: dtype of the weight and bias. Defaults to `float32`.
        """
        if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
            raise ValueError(
                f"GroupNorm: `groups` must be a positive int, got {groups!r}."
            )
        if channels is not None and channels % groups != 0:
            raise ValueError(
                f"GroupNorm: `groups={groups}` must divide `channels={channels}`."
            )
        if channels is None and channelwise_affine:
            raise ValueError(
                "GroupNorm: `channels` must be given when `channelwise_affine=True` "
                "(the affine parameters have one entry per channel)."
            )
        dtype = resolve_dtype(dtype, "GroupNorm")
        self.groups = groups
        self.channels = channels
        self.eps = _check_eps(eps, "GroupNorm")
        self.channelwise_affine = bool(channelwise_affine)
        self.weight, self.bias = _scale_and_shift(
            channels, dtype, self.channelwise_affine, self.channelwise_affine
        )

    def _check(self, x: Any) -> None:
        shape = jnp.shape(x)
        c = shape[0] if shape else None
        if c is not None and self.channels is None and c % self.groups == 0:
            return
        if c is not None and c == self.channels:
            return
        name = layer_name(self, "groups", "channels")
        want = "channels" if self.channels is None else self.channels
        extra = (
            ""
            if self.channels is not None
            else f", channels divisible by {self.groups}"
        )
        raise ValueError(
            f"{name}: expected input of shape ({want}, *spatial){extra}, got {shape}."
        )

    def __call__(
        self,
        x: _ChannelsFirst,
        state: Any = _NO_STATE,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Any:
        """**Arguments:**

        - `x`: an array of shape `(channels, *spatial)`.
        - `state`: optional; passed through unchanged, so that the layer can be
            swapped with [`boxwood.nn.BatchNorm`][] (`y, state = norm(x, state)`).
        - `key`: ignored. (Keyword only.)

        **Returns:**

        An array of the same shape and dtype as `x`; or `(output, state)` if `state`
        was given.
        """
        del key
        self._check(x)
        wide, dtype = _upcast(x)
        shape = wide.shape
        out = _standardise(wide.reshape(self.groups, -1), self.eps, axis=1)
        out = out.reshape(shape)
        if self.weight is not None and self.bias is not None:  # channelwise_affine
            spatial = (1,) * (len(shape) - 1)
            out = _affine(
                out,
                self.weight.reshape(shape[0], *spatial),
                self.bias.reshape(shape[0], *spatial),
            )
        return _with_state(out.astype(dtype), state)
