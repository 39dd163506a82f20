"""The same tiny MLP written five ways: boxwood, equinox, flax.nnx, a registered
dataclass, and a flat list of arrays (what raw `jax.jit` sees: the limit).

Every form computes `h = tanh(h @ w + b)` for each layer, with the same weights
(drawn once with NumPy from a seed), so outputs agree across contenders. Each layer
holds two arrays, so an MLP of `n` layers has `2 n` array leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import boxwood

WIDTH = 4
KINDS = ("raw", "boxwood", "equinox", "nnx", "dataclass")


def layers_for(leaves: int) -> int:
    """The number of layers giving `leaves` array leaves (two per layer)."""
    return max(1, leaves // 2)


def make_weights(n_layers: int, width: int = WIDTH, seed: int = 0) -> list:
    """`n_layers` pairs `(w, b)` of NumPy float32 arrays, `w` of shape
    `(width, width)` scaled so that activations stay in tanh's useful range."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(width)
    return [
        (
            (rng.standard_normal((width, width)) * scale).astype(np.float32),
            (rng.standard_normal(width) * 0.1).astype(np.float32),
        )
        for _ in range(n_layers)
    ]


def apply_pairs(pairs, x):
    """The MLP's math, shared by every form: `x` of shape `(width,)` or
    `(batch, width)`."""
    for w, b in pairs:
        x = jnp.tanh(x @ w + b)
    return x


def mse(pred, y):
    return jnp.mean((pred - y) ** 2)


# ----------------------------------------------------------------- flat list (raw)
def raw_apply(leaves: Sequence, x):
    """The MLP over the flat list `[w0, b0, w1, b1, ...]`."""
    return apply_pairs(zip(leaves[0::2], leaves[1::2]), x)


# ------------------------------------------------------------------------ boxwood
class BwLinear(boxwood.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(x @ self.weight + self.bias)


class BwMLP(boxwood.Module):
    layers: tuple

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class BwFnLinear(boxwood.Module):
    """`BwLinear` with its activation in an ordinary field, as Equinox code often
    writes it (`activation: Callable`): a non-array leaf, static for `filter_jit`."""

    weight: jax.Array
    bias: jax.Array
    activation: Callable

    def __call__(self, x):
        return self.activation(x @ self.weight + self.bias)


def boxwood_fn_field(weights: list) -> BwMLP:
    """The boxwood MLP whose layers hold `jnp.tanh` in a field (`BwFnLinear`)."""
    pairs = [(jnp.asarray(w), jnp.asarray(b)) for w, b in weights]
    return BwMLP(tuple(BwFnLinear(w, b, jnp.tanh) for w, b in pairs))


# ------------------------------------------------------------------------ equinox
class EqxLinear(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(x @ self.weight + self.bias)


class EqxMLP(eqx.Module):
    layers: tuple

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# ---------------------------------------------------------------------- flax.nnx
class NnxLinear(nnx.Module):
    def __init__(self, weight, bias):
        self.weight = nnx.Param(weight)
        self.bias = nnx.Param(bias)

    def __call__(self, x):
        return jnp.tanh(x @ self.weight[...] + self.bias[...])


class NnxMLP(nnx.Module):
    def __init__(self, layers):
        self.layers = nnx.List(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# ------------------------------------------------- registered dataclass (the limit)
@dataclasses.dataclass(frozen=True)
class DcLinear:
    weight: jax.Array
    bias: jax.Array


@dataclasses.dataclass(frozen=True)
class DcMLP:
    layers: tuple


jax.tree_util.register_dataclass(
    DcLinear, data_fields=["weight", "bias"], meta_fields=[]
)
jax.tree_util.register_dataclass(DcMLP, data_fields=["layers"], meta_fields=[])


# ---------------------------------------------------------------------- builders
def build(kind: str, weights: list):
    """The model of form `kind` (one of `KINDS`) holding fresh device copies of
    `weights` (from `make_weights`)."""
    pairs = [(jnp.asarray(w), jnp.asarray(b)) for w, b in weights]
    if kind == "raw":
        return [a for pair in pairs for a in pair]
    if kind == "boxwood":
        return BwMLP(tuple(BwLinear(w, b) for w, b in pairs))
    if kind == "equinox":
        return EqxMLP(tuple(EqxLinear(w, b) for w, b in pairs))
    if kind == "nnx":
        return NnxMLP([NnxLinear(w, b) for w, b in pairs])
    if kind == "dataclass":
        return DcMLP(tuple(DcLinear(w, b) for w, b in pairs))
    raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")


def count_leaves(kind: str, model) -> int:
    if kind == "nnx":
        return len(jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
    return len(jax.tree_util.tree_leaves(model))
