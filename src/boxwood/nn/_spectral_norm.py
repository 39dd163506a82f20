"""`SpectralNorm`: divide a layer's weight by its largest singular value."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import field
from .._tree import tree_at
from ._state import State, StateIndex
from ._stateful import StatefulLayer
from ._weight_norm import call_layer, get_weight

_Layer = TypeVar("_Layer")


def _unit(x: Array, eps: float) -> Array:
    return x / jnp.maximum(jnp.sqrt(jnp.sum(x * x)), eps)


def _power_iteration(w: Array, u: Array, v: Array, eps: float) -> tuple[Array, Array]:
    u = _unit(w @ v, eps)
    v = _unit(w.T @ u, eps)
    return u, v


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
        w = weight.reshape(weight.shape[0], -1).astype(dtype)
        ukey, vkey = jr.split(key)
        u = jr.normal(ukey, (w.shape[0],), dtype)
        v = jr.normal(vkey, (w.shape[1],), dtype)
        for _ in range(15):  # start from a good estimate, as PyTorch does
            u, v = _power_iteration(w, u, v, eps)
        self.layer = layer
        self.uv_index = StateIndex((u, v))
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
        inference = self.inference if inference is None else inference
        weight, state = self._normalised_weight(state, inference)
        layer = tree_at(lambda m: getattr(m, self.weight_name), self.layer, weight)
        return call_layer(layer, x, key), state

    def _normalised_weight(self, state: State, inference: bool) -> tuple[Array, State]:
        u, v = state.get(self.uv_index)
        weight = getattr(self.layer, self.weight_name)
        w: Float[Array, "rows cols"] = weight.reshape(weight.shape[0], -1)
        if not inference:
            fixed = lax.stop_gradient(w).astype(u.dtype)
            for _ in range(self.num_power_iterations):
                u, v = _power_iteration(fixed, u, v, self.eps)
            state = state.set(self.uv_index, (u, v))
        sigma = u.astype(w.dtype) @ w @ v.astype(w.dtype)
        return (w / sigma).reshape(weight.shape), state
