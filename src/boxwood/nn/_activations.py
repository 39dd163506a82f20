"""`PReLU`."""

from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._module import Module
from ._defaults import resolve_dtype


class PReLU(Module):
    """Parametric ReLU: `x` where `x > 0`, else `negative_slope * x`, with a learnt
    `negative_slope`.

    Same signature as `equinox.nn.PReLU` (plus `dtype`); the default slope `0.25` is
    PyTorch's. A scalar slope is shared by every entry. For one slope per channel,
    pass an array: it broadcasts against the input with NumPy's rules (trailing axes
    aligned), so for an input of shape `(channels,)` pass `init_alpha` of shape
    `(channels,)`, and for `(channels, *spatial)` one of shape `(channels, 1, ...)`.

    >>> import boxwood.nn, jax.numpy as jnp
    >>> boxwood.nn.PReLU()(jnp.array([-2.0, 3.0]))
    Array([-0.5,  3. ], dtype=float32)
    """

    negative_slope: Float[Array, "..."]

    def __init__(self, init_alpha: float | ArrayLike = 0.25, dtype: Any = None):
        """**Arguments:**

        - `init_alpha`: the initial slope for negative inputs: a float (one shared
            slope) or an array of slopes that broadcasts against the input.
        - `dtype`: dtype of the slope. Defaults to `float32`, or to `init_alpha`'s
            dtype if it is a floating-point array.
        """
        own = getattr(init_alpha, "dtype", None)
        if dtype is None and own is not None and jnp.issubdtype(own, jnp.floating):
            dtype = own
        dtype = resolve_dtype(dtype, "PReLU")
        self.negative_slope = jnp.asarray(init_alpha, dtype)

    def __call__(
        self, x: Float[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "..."]:
        """**Arguments:**

        - `x`: an array whose shape the slope broadcasts to.
        - `key`: ignored. (Keyword only.)

        **Returns:**

        An array of the same shape and dtype as `x`.
        """
        del key
        x = jnp.asarray(x)
        slope_shape = jnp.shape(self.negative_slope)
        try:
            ok = np.broadcast_shapes(slope_shape, x.shape) == x.shape
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"PReLU(negative_slope.shape={slope_shape}): the slope does not "
                f"broadcast to the input of shape {x.shape}. For per-channel slopes "
                "on a (channels, *spatial) input, give the slope shape "
                "(channels, 1, ..., 1)."
            )
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            # as Equinox: an integer input gives a floating output
            x = x.astype(self.negative_slope.dtype)
        slope = jnp.broadcast_to(self.negative_slope.astype(x.dtype), x.shape)
        return jnp.where(x > 0, x, slope * x)
