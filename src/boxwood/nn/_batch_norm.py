"""`BatchNorm`: PyTorch's running statistics (`mode="torch"`, the default) or
Equinox's two variants (`mode="ema"`, `mode="batch"`), each with its own state layout."""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._init import ones, scalar, zeros
from .._module import field
from .._warnings import user_stacklevel
from ._defaults import resolve_dtype
from ._input_checks import check_input, layer_name
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


_MODES = ("torch", "ema", "batch")
_Stats = tuple[Float[Array, " input_size"], Float[Array, " input_size"]]

_MSG_LEGACY = (
    "BatchNorm(mode='legacy') is Equinox's deprecated spelling of mode='ema' (which "
    "typically trains worse than batch statistics); pass mode='ema' to keep it, or "
    "mode='batch' / mode='torch' (the default) for batch statistics."
)


class BatchNorm(StatefulLayer):
    r"""Normalises each channel by a mean and variance over the batch and spatial
    dimensions, then optionally applies a channelwise affine map.

    $$y_c = \frac{x_c - \mathbb{E}[x_c]}{\sqrt{\operatorname{Var}[x_c] + \varepsilon}}
    \gamma_c + \beta_c$$

    Call it on a single example of shape `(input_size, *spatial)` inside
    `jax.vmap(..., axis_name=axis_name)`; statistics are taken over the vmapped
    axis and the spatial axes. `mode` chooses how training updates the running
    statistics and what inference uses (with `m = momentum`):

    - `"torch"` (the default): training normalises with the batch mean and
      (biased) batch variance and updates `running = m * running + (1 - m) *
      batch` with the *unbiased* batch variance, starting from mean 0 and variance
      1; inference normalises with the running statistics. This is exactly
      PyTorch's `BatchNorm` with `torch_momentum = 1 - m`, so a model trained in
      either library evaluates identically in the other. State: `state_index`
      holds `(running_mean, running_var)`.
    - `"batch"` (Equinox's): training normalises with the batch statistics and
      updates `hidden = m * hidden + (1 - m) * batch` (biased variance, from mean 0
      and variance 1) and a step counter; inference normalises with
      `hidden / (1 - m**counter)` (`hidden` itself before any step). State:
      `batch_counter` and `batch_state_index`, as in Equinox.
    - `"ema"` (Equinox's): training updates `running = m * running + (1 - m) *
      batch` (biased variance; the first step stores the batch statistics) and
      normalises with the *updated running* statistics; inference uses them too.
      State: `ema_first_time_index` and `ema_state_index`, as in Equinox.
      (`"legacy"`, Equinox's deprecated default, means `"ema"` and warns.)

    The fields of the other modes are `None`, so in each mode the model has the
    same leaves as Equinox's, and `state.get(bn.<index>)` reads the same values.

    ```python
    bn, state = boxwood.nn.make_with_state(boxwood.nn.BatchNorm)(3, "batch")
    batched = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    y, state = batched(x, state)  # x: (batch, 3, ...)
    ```
    """

    weight: Float[Array, " input_size"] | None
    bias: Float[Array, " input_size"] | None
    ema_first_time_index: StateIndex[Bool[Array, ""]] | None
    ema_state_index: StateIndex[_Stats] | None
    batch_counter: StateIndex[Int[Array, ""]] | None
    batch_state_index: StateIndex[_Stats] | None
    state_index: StateIndex[_Stats] | None
    input_size: int = field(static=True)
    axis_name: Hashable | Sequence[Hashable] = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    momentum: float = field(static=True)
    inference: bool = field(static=True)
    mode: Literal["torch", "ema", "batch"] = field(static=True)
    equinox_scalar_fields = ("inference",)  # a record in Equinox .eqx files

    def __init__(
        self,
        input_size: int,
        axis_name: Hashable | Sequence[Hashable],
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        momentum: float = 0.99,
        inference: bool = False,
        dtype: Any = None,
        mode: Literal["torch", "ema", "batch", "legacy"] = "torch",
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
        - `mode`: `"torch"` (the default), `"batch"` or `"ema"`: how the running
          statistics are kept and used; see the class documentation. (Equinox's
          default, `"legacy"`, is `"ema"` with a warning; boxwood's default is
          PyTorch's behaviour, which Equinox's `"batch"` also approaches.)
        """
        if not 0 <= momentum < 1:
            raise ValueError(
                f"BatchNorm: `momentum` must be in [0, 1), got {momentum}."
            )
        mode = _check_mode(mode)
        if isinstance(axis_name, list):
            axis_name = tuple(axis_name)
        dtype = resolve_dtype(dtype, "BatchNorm")
        channel = (input_size,)
        self.weight, self.bias = (
            (ones(channel, dtype), zeros(channel, dtype))
            if channelwise_affine
            else (None, None)
        )
        self._init_state(mode, input_size, dtype)
        self.input_size = input_size
        self.axis_name = axis_name
        self.eps = eps
        self.channelwise_affine = channelwise_affine
        self.momentum = momentum
        self.inference = inference
        self.mode = mode

    def _init_state(self, mode: str, size: int, dtype: Any) -> None:
        """Create the state indices of `mode` (those of the other modes are None)."""
        zeros_ones = (zeros((size,), dtype), ones((size,), dtype))
        self.ema_first_time_index = self.ema_state_index = None
        self.batch_counter = self.batch_state_index = self.state_index = None
        if mode == "torch":
            self.state_index = StateIndex(zeros_ones)
        elif mode == "batch":
            self.batch_counter = StateIndex(scalar(0))
            self.batch_state_index = StateIndex(zeros_ones)
        else:  # ema: the first step overwrites the (zero) buffers
            self.ema_first_time_index = StateIndex(scalar(True))
            empty = zeros((size,), dtype)
            self.ema_state_index = StateIndex((empty, empty))

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
        # Statistics in at least float32, whatever the input's dtype.
        dtypes = (jnp.dtype(jnp.float32), x.dtype, self._state_dtype(state))
        compute = max(dtypes, key=lambda d: d.itemsize)
        xc = x.astype(compute).reshape(self.input_size, -1)
        update = {"torch": self._torch, "batch": self._batch, "ema": self._ema}
        mean, var, state = update[self.mode](xc, state, inference)
        mean, var = mean.astype(compute), var.astype(compute)
        y = (xc - mean[:, None]) * lax.rsqrt(var + self.eps)[:, None]
        if self.weight is not None and self.bias is not None:  # channelwise_affine
            y = (
                y * self.weight.astype(compute)[:, None]
                + self.bias.astype(compute)[:, None]
            )
        return y.reshape(x.shape).astype(x.dtype), state

    def _state_dtype(self, state: State) -> Any:
        index = {"torch": self.state_index, "batch": self.batch_state_index}.get(
            self.mode, self.ema_state_index
        )
        assert index is not None  # the mode's own index is present
        return state.get(index)[0].dtype

    def _torch(self, xc: Array, state: State, inference: bool) -> tuple:
        index = self.state_index
        assert index is not None  # present in this mode
        running_mean, running_var = state.get(index)
        if inference:
            return running_mean, running_var, state
        count = _axis_size(self.axis_name) * xc.shape[1]
        if count < 2:
            raise ValueError(
                f"{layer_name(self, 'input_size')}: training needs more than one value "
                f"per channel (batch size x spatial size), got {count}. Use a larger "
                "batch, or `inference=True`."
            )
        mean, var = self._moments(xc)
        unbiased = var * (count / (count - 1))
        new = _ema(self.momentum, (running_mean, running_var), (mean, unbiased))
        return mean, var, state.set(index, new)

    def _batch(self, xc: Array, state: State, inference: bool) -> tuple:
        counter_index, index = self.batch_counter, self.batch_state_index
        assert counter_index is not None and index is not None  # present in this mode
        counter = state.get(counter_index)
        hidden = state.get(index)
        if inference:
            # Equinox's zero-debiasing: hidden / (1 - m**counter), hidden at step 0.
            steps = counter.astype(hidden[0].dtype)
            scale = jnp.where(counter == 0, 1.0, 1.0 - self.momentum**steps)
            return hidden[0] / scale, hidden[1] / scale, state
        mean, var = self._moments(xc)
        state = state.set(counter_index, counter + 1)
        state = state.set(index, _ema(self.momentum, hidden, (mean, var)))
        return mean, var, state

    def _ema(self, xc: Array, state: State, inference: bool) -> tuple:
        first_index, index = self.ema_first_time_index, self.ema_state_index
        assert first_index is not None and index is not None  # present in this mode
        running = state.get(index)
        if inference:
            return running[0], running[1], state
        first_time = state.get(first_index)
        mean, var = self._moments(xc)
        batch = (mean.astype(running[0].dtype), var.astype(running[1].dtype))
        mixed = _ema(self.momentum, running, batch)
        mean, var = (lax.select(first_time, b, r) for b, r in zip(batch, mixed))
        state = state.set(first_index, jnp.array(False))
        return mean, var, state.set(index, (mean, var))

    def _moments(self, xc: Array) -> tuple[Array, Array]:
        """Per-channel mean and biased variance over the batch (and space)."""
        _axis_size(self.axis_name)  # a clear error outside a matching vmap
        mean = lax.pmean(jnp.mean(xc, axis=1), self.axis_name)
        centred = xc - mean[:, None]
        var = lax.pmean(jnp.mean(centred * centred, axis=1), self.axis_name)
        return mean, jnp.maximum(var, 0)


def _ema(momentum: float, running: _Stats, batch: tuple[Array, Array]) -> _Stats:
    """`momentum * running + (1 - momentum) * batch`, in the running stats' dtype."""
    (mean, var), (batch_mean, batch_var) = running, batch
    return (
        momentum * mean + (1 - momentum) * batch_mean.astype(mean.dtype),
        momentum * var + (1 - momentum) * batch_var.astype(var.dtype),
    )


def _check_mode(mode: Any) -> Literal["torch", "ema", "batch"]:
    if mode == "legacy":
        warnings.warn(_MSG_LEGACY, DeprecationWarning, stacklevel=user_stacklevel())
        return "ema"
    if mode not in _MODES:
        raise ValueError(
            f"BatchNorm: `mode` must be one of 'torch' (PyTorch's running "
            f"statistics, the default), 'batch' or 'ema' (Equinox's), got {mode!r}."
        )
    return mode
