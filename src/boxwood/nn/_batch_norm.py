"""`BatchNorm`, with running statistics that behave exactly as PyTorch's."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import field
from ._checks import check_input, layer_name
from ._misc import resolve_dtype
from ._state import State, StateIndex
from ._stateful import StatefulLayer


def _axis_size(axis_name: Any) -> int:
    names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
    try:
        return math.prod(lax.axis_size(n) for n in names)
    except NameError as e:
        raise NameError(
            f"BatchNorm(axis_name={axis_name!r}) must be called inside "
            f"`jax.vmap(..., axis_name={axis_name!r})` (or another transformation "
            "naming that axis): it averages over the batch. Original error: "
            f"{e}"
        ) from None


class BatchNorm(StatefulLayer):
    r"""Normalises each channel by the mean and variance over the batch and spatial
    dimensions, then optionally applies a channelwise affine map.

    $$y_c = \frac{x_c - \mathbb{E}[x_c]}{\sqrt{\operatorname{Var}[x_c] + \varepsilon}}
    \gamma_c + \beta_c$$

    Call it on a single example of shape `(input_size, *spatial)` inside
    `jax.vmap(..., axis_name=axis_name)`; statistics are taken over the vmapped
    axis and the spatial axes.

    In training mode the batch mean and (biased) batch variance normalise the
    input, and the running statistics stored in the [`boxwood.nn.State`][] are
    updated with the batch mean and the *unbiased* batch variance:
    `running = momentum * running + (1 - momentum) * batch`. The running
    statistics start at mean 0 and variance 1. In inference mode the running
    statistics normalise the input and the state is unchanged. This is exactly
    PyTorch's `BatchNorm` with `torch_momentum = 1 - momentum`, so a model trained
    in either library evaluates identically in the other.

    ```python
    bn, state = boxwood.nn.make_with_state(boxwood.nn.BatchNorm)(3, "batch")
    batched = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    y, state = batched(x, state)  # x: (batch, 3, ...)
    ```
    """

    weight: Float[Array, " input_size"] | None
    bias: Float[Array, " input_size"] | None
    state_index: StateIndex
    input_size: int = field(static=True)
    axis_name: Hashable | Sequence[Hashable] = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    momentum: float = field(static=True)
    inference: bool = field(static=True)

    def __init__(
        self,
        input_size: int,
        axis_name: Hashable | Sequence[Hashable],
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        momentum: float = 0.99,
        inference: bool = False,
        dtype: Any = None,
    ):
        """**Arguments:**

        - `input_size`: the number of channels.
        - `axis_name`: the name of the batch axis given to `jax.vmap` (or a tuple of
          names, to average over several named axes).
        - `eps`: added to the variance for numerical stability.
        - `channelwise_affine`: whether to learn a per-channel scale (`weight`,
          initialised to 1) and shift (`bias`, initialised to 0).
        - `momentum`: how much of the running statistics to keep at each update, in
          `[0, 1)`. (PyTorch's `momentum` is `1 - momentum`.)
        - `inference`: if `True`, normalise with the running statistics and do not
          update them. Set model-wide by [`boxwood.nn.inference_mode`][], or override
          per call.
        - `dtype`: dtype of the parameters and running statistics; defaults to
          float32 (float64 when JAX's x64 mode is on).
        """
        if not 0 <= momentum < 1:
            raise ValueError(
                f"BatchNorm: `momentum` must be in [0, 1), got {momentum}."
            )
        if isinstance(axis_name, list):
            axis_name = tuple(axis_name)
        dtype = resolve_dtype(dtype, "BatchNorm")
        if channelwise_affine:
            self.weight = jnp.ones((input_size,), dtype)
            self.bias = jnp.zeros((input_size,), dtype)
        else:
            self.weight = None
            self.bias = None
        init = (jnp.zeros((input_size,), dtype), jnp.ones((input_size,), dtype))
        self.state_index = StateIndex(init)
        self.input_size = input_size
        self.axis_name = axis_name
        self.eps = eps
        self.channelwise_affine = channelwise_affine
        self.momentum = momentum
        self.inference = inference

    def __call__(
        self,
        x: Float[Array, "input_size ..."],
        state: State,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> tuple[Float[Array, "input_size ..."], State]:
        """**Arguments:**

        - `x`: one example, of shape `(input_size, *spatial)`.
        - `state`: the [`boxwood.nn.State`][] holding the running statistics.
        - `key`: ignored.
        - `inference`: overrides `self.inference` when not `None`.

        **Returns:** `(y, state)`: the normalised `x` (same shape and dtype) and the
        updated state.
        """
        if jnp.ndim(x) == 0 or x.shape[0] != self.input_size:
            check_input(x, (self.input_size, "..."), layer_name(self, "input_size"))
        inference = self.inference if inference is None else inference
        running_mean, running_var = state.get(self.state_index)
        # Statistics in at least float32, whatever the input's dtype.
        dtypes = (jnp.dtype(jnp.float32), x.dtype, running_mean.dtype)
        compute = max(dtypes, key=lambda d: d.itemsize)
        xc = x.astype(compute).reshape(self.input_size, -1)
        if inference:
            mean, var = running_mean.astype(compute), running_var.astype(compute)
        else:
            mean, var, unbiased = self._batch_stats(xc)
            m = self.momentum
            new_mean = m * running_mean + (1 - m) * mean.astype(running_mean.dtype)
            new_var = m * running_var + (1 - m) * unbiased.astype(running_var.dtype)
            state = state.set(self.state_index, (new_mean, new_var))
        y = (xc - mean[:, None]) * lax.rsqrt(var + self.eps)[:, None]
        if self.channelwise_affine:
            y = (
                y * self.weight.astype(compute)[:, None]
                + self.bias.astype(compute)[:, None]
            )
        return y.reshape(x.shape).astype(x.dtype), state

    def _batch_stats(self, xc: Array) -> tuple[Array, Array, Array]:
        """Per-channel mean, biased variance and unbiased variance over the batch."""
        count = _axis_size(self.axis_name) * xc.shape[1]
        if count < 2:
            raise ValueError(
                f"{layer_name(self, 'input_size')}: training needs more than one value "
                f"per channel (batch size x spatial size), got {count}. Use a larger "
                "batch, or `inference=True`."
            )
        mean = lax.pmean(jnp.mean(xc, axis=1), self.axis_name)
        centred = xc - mean[:, None]
        var = lax.pmean(jnp.mean(centred * centred, axis=1), self.axis_name)
        var = jnp.maximum(var, 0)
        return mean, var, var * (count / (count - 1))
