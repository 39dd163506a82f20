"""`SpectralNorm`: divide a layer's weight by its largest singular value."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, PRNGKeyArray

from .._module import field
from ._state import State, StateIndex
from ._stateful import StatefulLayer
from ._weight_norm import call_with_weight, get_weight

_Layer = TypeVar("_Layer")


def _unit(x: Array, eps: float) -> Array:
    return x / jnp.maximum(jnp.sqrt(jnp.sum(x * x)), eps)


def _power_steps(
    w: Array, uv: tuple[Array, Array], steps: int, eps: float
) -> tuple[Array, Array]:
    """`steps` rounds of power iteration for the top singular vectors of `w`."""
    u, v = uv
    for _ in range(steps):
        u = _unit(w @ v, eps)
        v = _unit(w.T @ u, eps)
    return u, v


def _initial_uv(
    w: Array, dtype: Any, eps: float, key: PRNGKeyArray
) -> tuple[Array, Array]:
    """Random starting vectors refined by 15 steps, as PyTorch starts them (a
    good estimate from the first call on)."""
    ukey, vkey = jr.split(key)
    start = (
        jr.normal(ukey, (w.shape[0],), dtype),
        jr.normal(vkey, (w.shape[1],), dtype),
    )
    return _power_steps(w, start, 15, eps)


def _as_matrix(weight: Array) -> Array:
    return weight.reshape(weight.shape[0], -1)


class SpectralNorm(StatefulLayer, Generic[_Layer]):
    r"""Spectral normalisation (Miyato et al., 2018) of a wrapped layer's weight.

    The weight $W$ (reshaped to a matrix `(shape[0], -1)`) is used as $W /
    \sigma(W)$, where $\sigma(W) = u^\top W v$ estimates its largest singular
    value. The vectors $u, v$ live in the [`boxwood.nn.State`][] and are refined by
    `num_power_iterations` steps of power iteration at every call in training
    mode (not in inference mode); no gradient flows through the power iteration.
    Build it with [`boxwood.nn.make_with_state`][] and call it as
    `y, state = layer(x, state)`.
    """

    layer: _Layer
    uv_index: StateIndex
    weight_name: str = field(static=True)
    num_power_iterations: int = field(static=True)
    eps: float = field(static=True)
    inference: bool = field(static=True)
    equinox_scalar_fields = ("inference",)  # a record in Equinox .eqx files

    def __init__(
        self,
        layer: _Layer,
        weight_name: str,
        num_power_iterations: int = 1,
        eps: float = 1e-12,
        inference: bool = False,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `layer`: the layer to wrap, e.g. a [`boxwood.nn.Linear`][] or a
          convolution.
        - `weight_name`: the name of the layer's weight array (at least 2-D).
        - `num_power_iterations`: power-iteration steps per call in training mode.
        - `eps`: lower bound on norms, for numerical stability.
        - `inference`: if `True`, use the stored `u, v` without refining them. Set
          model-wide by [`boxwood.nn.inference_mode`][], or override per call.
        - `dtype`: dtype of `u` and `v`; defaults to the weight's dtype.
        - `key`: a `jax.random` key for the initial `u, v`. (Keyword only.)
        """
        weight = get_weight(layer, weight_name, "SpectralNorm")
        if weight.ndim < 2:
            raise ValueError(
                f"SpectralNorm: the weight {weight_name!r} must be at least "
                f"2-dimensional, got shape {weight.shape}."
            )
        if num_power_iterations < 0:
            raise ValueError(
                "SpectralNorm: `num_power_iterations` must be non-negative, got "
                f"{num_power_iterations}."
            )
        dtype = weight.dtype if dtype is None else jnp.dtype(dtype)
        self.layer = layer
        self.uv_index = StateIndex(
            _initial_uv(_as_matrix(weight).astype(dtype), dtype, eps, key)
        )
        self.weight_name = weight_name
        self.num_power_iterations = num_power_iterations
        self.eps = eps
        self.inference = inference

    def __call__(
        self,
        x: Array,
        state: State,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> tuple[Array, State]:
        """**Arguments:**

        - `x`: the wrapped layer's input.
        - `state`: the [`boxwood.nn.State`][] holding `u, v`.
        - `key`: passed on to the wrapped layer if it takes one.
        - `inference`: overrides `self.inference` when not `None`.

        **Returns:** `(y, state)`: the wrapped layer's output computed with the
        normalised weight, and the updated state.
        """
        if inference is None:
            inference = self.inference
        uv, state = self._vectors(state, inference)
        weight = getattr(self.layer, self.weight_name)
        matrix = _as_matrix(weight)
        u, v = (a.astype(matrix.dtype) for a in uv)
        sigma = u @ matrix @ v  # the estimated largest singular value
        return call_with_weight(
            self.layer, self.weight_name, weight / sigma, x, key
        ), state

    def _vectors(self, state: State, inference: bool) -> tuple[Any, State]:
        """The singular vector estimates `(u, v)`; in training, first refined by
        `num_power_iterations` steps (with no gradient) and stored back."""
        uv = state.get(self.uv_index)
        if inference:
            return uv, state
        weight = getattr(self.layer, self.weight_name)
        frozen = lax.stop_gradient(_as_matrix(weight)).astype(uv[0].dtype)
        uv = _power_steps(frozen, uv, self.num_power_iterations, self.eps)
        return uv, state.set(self.uv_index, uv)
