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
import jax.core
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
    drawn from `key` (a key of the `rbg` family keeps its words), from which
    the models derive their layers', parts' and rows' keys by `derived_key`
    (no draw). A model then hashes with
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


# What a derived key is for (`derived_key`): the same number under two purposes
# gives two keys.
LAYER, PART, ROW = 1, 2, 3
_WORD = 0xFFFFFFFF
# Odd multipliers: the golden ratio's and murmur3's (to 32 bits).
_GOLDEN, _M1, _M2 = 0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35
_LANES = np.asarray([(i * _M2 + 1) & _WORD for i in range(4)], np.uint32)


def _mix(x: Any) -> Any:
    """murmur3's finaliser on each uint32 word: a bijection in which every
    input bit flips each output bit with probability about 1/2."""
    x = x ^ (x >> 16)
    x = x * np.uint32(_M1)
    x = x ^ (x >> 13)
    x = x * np.uint32(_M2)
    return x ^ (x >> 16)


def _tweak(number: Any, purpose: int) -> Any:
    """Four uint32 words for `(number, purpose)`: NumPy constants for numbers
    known when tracing (an array of numbers gives one row each), computed in the
    program for a traced one."""
    base = np.uint32((purpose * _M1) & _WORD)
    if isinstance(number, jax.core.Tracer):
        words = number.astype(jnp.uint32) * np.uint32(_GOLDEN)
        return _mix(words[..., None] + base + _LANES)
    numbers = np.asarray(number, np.int64) & _WORD
    words = ((numbers * _GOLDEN) & _WORD).astype(np.uint32)
    return _mix(words[..., None] + base + _LANES)


def derived_key(key: Any, number: Any, purpose: int) -> Any:
    """The `unsafe_rbg` key for `number` (an integer, traced or not: a layer's
    index inside the scan over the layers; or an array of them, for a stack of
    keys) and `purpose` (`LAYER`, `PART` or `ROW`) derived from `key`, an
    `unsafe_rbg` key (`stream_key`'s).

    Its words are `key`'s XORed with a tweak of the pair, each then mixed by
    murmur3's finaliser: a few integer operations on four words (none for a
    number known when tracing but the XOR and the mix), where JAX's
    `unsafe_rbg` `split` and `fold_in` each draw from `RngBitGenerator`. The
    mix is a bijection of each word, so keys derived from one key with two
    pairs differ, as do keys derived from two keys with one pair; and unlike
    XOR with a tweak alone (JAX's `fold_in` for these keys), deriving twice
    with the same pair does not return to an earlier key."""
    tweak = _tweak(number, purpose)
    words = jnp.broadcast_to(jax.random.key_data(key), tweak.shape)
    return jax.random.wrap_key_data(_mix(words ^ tweak), impl="unsafe_rbg")


def _is_stream(key: Any) -> bool:
    """Whether `key` is one key of the `unsafe_rbg` family (what `stream_key`
    makes for rbg masks): the keys derived from it are then `derived_key`'s."""
    return (
        jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        and key.ndim == 0
        and str(jr.key_impl(key)) == "unsafe_rbg"
    )


def fold_key(key: Any, number: Any, purpose: int) -> Any:
    """The key for `number` (traced or not) from `key`: `derived_key`'s for an
    `unsafe_rbg` key (`stream_key`'s for rbg masks), `jax.random.fold_in`'s
    otherwise."""
    if _is_stream(key):
        return derived_key(key, number, purpose)
    return jr.fold_in(key, number)


def split_keys_of(key: Any, n: int, purpose: int) -> Any:
    """`n` keys from `key`, stacked: `derived_key`'s for an `unsafe_rbg` key
    (one per number `0, ..., n - 1`), `jax.random.split`'s otherwise."""
    if _is_stream(key):
        return derived_key(key, np.arange(n), purpose)
    return jr.split(key, n)


def keep_mask(key: Any, q: float, shape: tuple[int, ...]) -> Any:
    """A boolean mask of `shape`, each entry `True` with probability `q` (in
    `(0, 1)`), drawn as `dropout_generator` says."""
    if resolved_generator() == "threefry":
        return jr.bernoulli(key, q, shape)
    bits = jr.bits(_rbg_key(key), shape, jnp.uint32)
    # `bits < t` holds with probability t / 2**32: `q` to 32 bits.
    threshold = min(int(round(q * 2.0**32)), 2**32 - 1)
    return bits < np.uint32(threshold)
