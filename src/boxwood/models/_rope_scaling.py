"""RoPE settings of a `config.json`: the base `rope_theta` and an optional scaling
(`linear`, Llama 3's `llama3`, or `dynamic` NTK scaling), read from either
spelling `transformers` writes (`rope_parameters`, or the older `rope_scaling`
beside a top-level `rope_theta`), and the rotation frequencies they give."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._model_config import ConfigError

# The keys each scaling takes besides `rope_type` (and `rope_theta`). A key that is
# not listed (`attention_factor`, `partial_rotary_factor`, ...) changes the model
# in a way boxwood does not compute, so it is refused by name.
SCALINGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
    # Scaled against `max_position_embeddings`: `transformers` ignores an
    # `original_max_position_embeddings` here, so the key is refused.
    "dynamic": ("factor",),
}

# A scaling as a config field: sorted `(key, value)` pairs including `rope_type`
# (hashable, so the config can stay a static field of the model), or `None`.
Scaling = tuple[tuple[str, Any], ...] | None


def read_rope(
    options: dict[str, Any], theta: float, where: str
) -> tuple[float, Scaling]:
    """Take the RoPE options out of `options` (changed in place) and return
    `(rope_theta, scaling)`; `theta` is the default base."""
    theta = options.pop("rope_theta", theta)
    parameters = options.pop("rope_parameters", None)
    legacy = options.pop("rope_scaling", None)
    if parameters is not None and legacy is not None:
        raise ConfigError(
            f"{where}both `rope_parameters` and `rope_scaling` are set; keep one."
        )
    given = parameters if parameters is not None else legacy
    if given is None:
        return float(theta), None
    name = "rope_parameters" if parameters is not None else "rope_scaling"
    if not isinstance(given, Mapping):
        raise ConfigError(f"{where}`{name}` must be a JSON object, got {given!r}.")
    given = dict(given)
    theta = given.pop("rope_theta", theta)
    return float(theta), normalise_scaling(given, f"{where}`{name}`")


def normalise_scaling(given: Mapping[str, Any] | None, where: str) -> Scaling:
    """A scaling's options as the config keeps them, checked; `None` for none."""
    if given is None:
        return None
    given = dict(given)
    kind = given.pop("rope_type", given.pop("type", "default"))
    if kind not in SCALINGS:
        raise ConfigError(
            f"{where}: `rope_type` = {kind!r} is not supported; boxwood computes "
            f"{', '.join(repr(k) for k in SCALINGS)}."
        )
    keys = SCALINGS[kind]
    for key, value in given.items():
        if key not in keys:
            raise ConfigError(
                f"{where}: the key `{key}` (= {value!r}) is not supported for "
                f"`rope_type` = {kind!r}; it takes {', '.join(keys) or 'no other keys'}."
            )
    missing = [key for key in keys if given.get(key) is None]
    if missing:
        raise ConfigError(
            f"{where}: `rope_type` = {kind!r} needs {', '.join(missing)}."
        )
    if kind == "default":
        return None
    return tuple(sorted({"rope_type": kind, **given}.items()))


def scaling_dict(theta: float, scaling: Scaling) -> dict[str, Any]:
    """`rope_parameters` as `transformers` writes it in `config.json`."""
    return {"rope_type": "default", "rope_theta": theta, **dict(scaling or ())}


def inverse_frequencies(head_dim: int, theta: float, scaling: Scaling) -> np.ndarray:
    """The rotation frequency of each pair of channels, `(head_dim // 2,)` float32:
    `theta ** (-2i / head_dim)`, then scaled.

    - `linear`: every frequency divided by `factor` (positions slowed down).
    - `llama3`: by wavelength against `original_max_position_embeddings`: short
      wavelengths (under `original / high_freq_factor`) are kept, long ones (over
      `original / low_freq_factor`) divided by `factor`, and those between
      interpolated linearly in `original / wavelength`.
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    base = (np.float32(1.0) / np.float32(theta) ** exponents).astype(np.float32)
    options = dict(scaling or ())
    kind = options.get("rope_type", "default")
    if kind == "linear":
        return (base / np.float32(options["factor"])).astype(np.float32)
    if kind == "llama3":
        return _llama3(base, options)
    return base


def is_dynamic(scaling: Scaling) -> bool:
    """Whether the frequencies depend on the call's extent (`dynamic` scaling)."""
    return dict(scaling or ()).get("rope_type") == "dynamic"


def attention_scaling(scaling: Scaling, max_positions: int) -> Scaling:
    """The scaling as an attention layer keeps it: a `dynamic` one with the length
    it scales against (the config's `max_position_embeddings`) added as
    `original_max_position_embeddings`; any other unchanged."""
    if not is_dynamic(scaling):
        return scaling
    extra = {"original_max_position_embeddings": int(max_positions)}
    return tuple(sorted({**dict(scaling or ()), **extra}.items()))


def frequencies_at(
    head_dim: int, theta: float, scaling: Scaling, positions: Any, extent: Any
) -> Any:
    """The frequencies of one call over `positions`: `inverse_frequencies` (a
    constant) for every scaling but `dynamic` (`scaling` from `attention_scaling`).

    `dynamic`: the call's sequence length `n` is `extent` (one more than the
    largest real position; `None`: `max(positions) + 1`). Up to `original`
    (`original_max_position_embeddings`) the frequencies are unscaled; past it
    the base becomes `theta * (factor * n / original - (factor - 1)) **
    (head_dim / (head_dim - 2))`. Computed in float32 under the trace.
    """
    if not is_dynamic(scaling):
        return inverse_frequencies(head_dim, theta, scaling)
    plain = inverse_frequencies(head_dim, theta, None)
    options = dict(scaling or ())
    if extent is None:
        extent = jnp.max(positions) + 1
    n = jnp.asarray(extent, jnp.float32)
    factor = np.float32(options["factor"])
    original = np.float32(options["original_max_position_embeddings"])
    stretch = (factor * n / original - (factor - 1)) ** np.float32(
        head_dim / (head_dim - 2)
    )
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    grown = 1.0 / (np.float32(theta) * stretch) ** exponents
    return jnp.where(n > original, grown, plain)


def _llama3(base: np.ndarray, options: dict[str, Any]) -> np.ndarray:
    factor = float(options["factor"])
    low, high = float(options["low_freq_factor"]), float(options["high_freq_factor"])
    original = float(options["original_max_position_embeddings"])
    wavelength = 2 * math.pi / base
    # 0 where the frequency is divided by `factor`, 1 where it is kept.
    keep = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
    keep = np.where(wavelength < original / high, 1.0, keep)
    keep = np.where(wavelength > original / low, 0.0, keep).astype(np.float32)
    scaled = (np.float32(1.0) - keep) * (base / np.float32(factor)) + keep * base
    return scaled.astype(np.float32)
