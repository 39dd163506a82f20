"""`Dropout`."""

import math
import warnings
from typing import TypeVar

import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from .._init import keep_mask
from .._module import Module, field
from .._warnings import user_stacklevel

_MSG_NO_KEY = (
    "Dropout(p={p}) is in training mode (`inference=False`) and needs a random key: "
    "call it as `dropout(x, key=key)`. To switch dropout off, call "
    "`dropout(x, inference=True)`, build it with `Dropout(p, inference=True)`, or "
    "switch a whole model with `model = boxwood.nn.inference_mode(model)`."
)


_Inference = TypeVar("_Inference", bool, bool | None)


def resolve_deterministic(
    inference: _Inference, deterministic: bool | None, where: str
) -> _Inference | bool:
    """`inference`, or the deprecated `deterministic` (with a warning) if given.

    Equinox accepts `deterministic=` as the deprecated spelling of `inference=`;
    `where` names the call in the warning, e.g. `"Dropout(deterministic=...)"`.
    """
    if deterministic is None:
        return inference
    warnings.warn(
        f"{where} is deprecated: pass `inference=...` instead (the same meaning).",
        DeprecationWarning,
        stacklevel=user_stacklevel(),
    )
    return deterministic


class Dropout(Module):
    """Randomly zeroes entries of its input with probability `p`, and scales the
    entries it keeps by `1/(1 - p)` (as `torch.nn.Dropout` does), so that the
    expected output equals the input. (Which entries are dropped differs from
    PyTorch for the same seed: the two use different random number generators.)
    The mask is drawn with threefry from `key`, except on a TPU, where the
    chip's own generator draws it, seeded from `key`: see
    [`boxwood.nn.dropout_generator`][].

    `p` and `inference` are static: a model holds only arrays, and switching modes
    compiles once per mode. Switch every dropout in a model at once with
    [`boxwood.nn.inference_mode`][].

    >>> import boxwood.nn, jax.numpy as jnp
    >>> boxwood.nn.Dropout(0.5, inference=True)(jnp.ones(2))
    Array([1., 1.], dtype=float32)
    """

    p: float = field(static=True)
    inference: bool = field(static=True)
    equinox_scalar_fields = ("p", "inference")  # records in Equinox .eqx files

    def __init__(
        self,
        p: float = 0.5,
        inference: bool = False,
        *,
        deterministic: bool | None = None,
    ):
        """**Arguments:**

        - `p`: the probability of zeroing each entry, in `[0, 1]`. A Python number.
        - `inference`: if `True` the layer is the identity; if `False` it applies
            dropout (and needs a `key` when called). Override per call with
            `dropout(x, inference=...)`, or for a whole model with
            [`boxwood.nn.inference_mode`][].
        - `deterministic`: deprecated spelling of `inference` (as in Equinox); it
            wins over `inference` and warns with a `DeprecationWarning`. (Keyword
            only.)
        """
        inference = resolve_deterministic(
            inference, deterministic, "Dropout(deterministic=...)"
        )
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            raise TypeError(
                f"`Dropout.p` must be a Python float in [0, 1], got {type(p).__name__}. "
                "It is static configuration, not an array."
            )
        if not (0.0 <= p <= 1.0) or math.isnan(p):
            raise ValueError(f"`Dropout.p` must be in [0, 1], got {p}.")
        self.p = float(p)
        self.inference = bool(inference)

    @property
    def deterministic(self) -> bool:
        """Deprecated alias of `inference` (Equinox keeps it for old code)."""
        return self.inference

    def __call__(
        self,
        x: Array,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """**Arguments:**

        - `x`: an array of any shape.
        - `key`: a `jax.random` key choosing which entries are zeroed. Required in
            training mode when `p > 0`. (Keyword only.)
        - `inference`: if given, overrides `self.inference` for this call.
            (Keyword only; a Python bool.)
        - `deterministic`: deprecated spelling of `inference`, with a
            `DeprecationWarning`. (Keyword only.)

        **Returns:**

        An array of the same shape and dtype as `x`.
        """
        inference = resolve_deterministic(
            inference, deterministic, "Dropout()(x, deterministic=...)"
        )
        if inference is None:
            inference = self.inference
        if inference or self.p == 0.0:
            return x
        if key is None:
            raise RuntimeError(_MSG_NO_KEY.format(p=self.p))
        x = jnp.asarray(x)
        if self.p == 1.0:
            return jnp.zeros_like(x)  # (avoids 0 * inf in the gradient)
        q = 1.0 - self.p
        keep = keep_mask(key, q, x.shape)
        return jnp.where(keep, x * (1.0 / q), jnp.zeros_like(x))
