"""Which random bit generator draws dropout's masks: the setting (the process's
default and each thread's own, which `nn.dropout_generator` and
`nn.set_dropout_generator` change), `keep_mask`, the mask itself, and
`stream_key`, the key a model derives its layers' dropout keys from. Below
`nn/` and `models/`, which both draw with it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

_NAMES = ("auto", "threefry", "rbg")
# The setting is read when a dropout layer is traced; a thread's `with` block
# is its own (another thread tracing at the same time keeps its setting).
_local = threading.local()
_default = ["auto"]


def _current() -> str:
    return getattr(_local, "name", None) or _default[0]


def _check(name: Any) -> str:
    if name not in _NAMES:
        raise ValueError(
            f"dropout_generator: `name` must be one of {', '.join(map(repr, _NAMES))} "
            f"('auto': the hardware generator on a TPU, threefry elsewhere); "
            f"got {name!r}."
        )
    return name


def set_default_generator(name: str) -> str:
    """Make `name` the process's generator; returns the previous one."""
    previous = _default[0]
    _default[0] = _check(name)
    return previous


@contextlib.contextmanager
def generator_in_thread(name: str) -> Iterator[None]:
    """Within the block, this thread's generator is `name`."""
    _check(name)
    outer = getattr(_local, "name", None)
    _local.name = name
    try:
        yield
    finally:
        _local.name = outer


def resolved_generator() -> str:
    """The generator dropout traced now uses: `"threefry"` or `"rbg"`."""
    name = _current()
    if name == "auto":
        return "rbg" if jax.default_backend() == "tpu" else "threefry"
    return name


def _rbg_key(key: Any) -> Any:
    """An `rbg` key seeded by four words drawn from `key` (any implementation;
    a key already of the `rbg` family is used as it is)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = str(jr.key_impl(key))
        if impl in ("rbg", "unsafe_rbg"):
            return key
    words = jr.bits(key, (4,), jnp.uint32)
    return jr.wrap_key_data(words, impl="rbg")


def stream_key(key: Any) -> Any:
    """The key from which a model derives the dropout keys of its parts and
    layers (`split`, `fold_in`), as the generator of the masks wants it: with
    threefry, `key` itself; with `rbg`, an `unsafe_rbg` key seeded by four words
    drawn from `key` (a key of the `rbg` family keeps its words), whose `split`
    and `fold_in` are draws of `RngBitGenerator` too. A model then hashes with
    threefry once per call, here, where deriving threefry keys per layer and
    per part (and seeding each mask from one) would put a threefry hash at every
    dropout of every layer, forward and recomputed backward, into the compiled
    program: on a TPU that doubled the step's program and its compile.

    `None`, a batch of keys (not one key) and keys already converted come back
    as they are."""
    if key is None or resolved_generator() == "threefry":
        return key
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if typed:
        if key.ndim:
            return key
        impl = str(jr.key_impl(key))
        if impl == "unsafe_rbg":
            return key
        if impl == "rbg":
            return jr.wrap_key_data(jr.key_data(key), impl="unsafe_rbg")
    elif jnp.shape(key) != (2,):
        return key
    return jr.wrap_key_data(jr.bits(key, (4,), jnp.uint32), impl="unsafe_rbg")


def keep_mask(key: Any, q: float, shape: tuple[int, ...]) -> Any:
    """A boolean mask of `shape`, each entry `True` with probability `q` (in
    `(0, 1)`), drawn as `dropout_generator` says."""
    if resolved_generator() == "threefry":
        return jr.bernoulli(key, q, shape)
    bits = jr.bits(_rbg_key(key), shape, jnp.uint32)
    # `bits < t` holds with probability t / 2**32: `q` to 32 bits.
    threshold = min(int(round(q * 2.0**32)), 2**32 - 1)
    return bits < np.uint32(threshold)
