"""PRNG keys on the host: split a concrete threefry key without compiling anything.

`jax.random.split` compiles one XLA kernel per number of keys (and unpacking its
result compiles slicing kernels); a model's constructor pays for each. With
`jax_threefry_partitionable=True` (JAX's default), key `i` of `split(key, n)` is
the Threefry-2x32 hash of the counter `(0, i)`: pure 32-bit integer arithmetic,
done here in NumPy, bit for bit the same (tests/init/test_init.py checks it).
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
_THREEFRY = "threefry2x32"
_MASK = 0xFFFFFFFF
#: Up to this many counters, `threefry2x32` runs on Python ints.
_SMALL = 8


def threefry2x32(k0: Any, k1: Any, x0: np.ndarray, x1: np.ndarray) -> tuple:
    """The Threefry-2x32 hash (20 rounds) of the counters `(x0, x1)` under the key
    `(k0, k1)`, on uint32 NumPy arrays; the same function as JAX's
    `threefry2x32_p`. (`x0`, `x1` are left unchanged; the rounds run in place on
    copies, so large inputs make few temporaries.)"""
    if x0.size <= _SMALL:
        return _threefry_small(int(k0), int(k1), x0, x1)
    k0, k1 = np.uint32(k0), np.uint32(k1)
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    spare = np.empty_like(x1)
    with np.errstate(over="ignore"):
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                np.add(x0, x1, out=x0)
                np.left_shift(x1, np.uint32(r), out=spare)  # x1 <<< r, then ^ x0
                np.right_shift(x1, np.uint32(32 - r), out=x1)
                np.bitwise_or(x1, spare, out=x1)
                np.bitwise_xor(x1, x0, out=x1)
            np.add(x0, ks[(i + 1) % 3], out=x0)
            np.add(x1, ks[(i + 2) % 3] + np.uint32(i + 1), out=x1)
    return x0, x1


def _threefry_small(k0: int, k1: int, x0: np.ndarray, x1: np.ndarray) -> tuple:
    """`threefry2x32` on Python ints, element by element: for a handful of counters
    (splitting a key in two or four) this is several times faster than the ~120
    NumPy calls of the array version."""
    ks = (k0, k1, k0 ^ k1 ^ int(_PARITY))
    out0, out1 = [], []
    for a, b in zip(x0.ravel().tolist(), x1.ravel().tolist()):
        a, b = (a + ks[0]) & _MASK, (b + ks[1]) & _MASK
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                a = (a + b) & _MASK
                b = (((b << r) | (b >> (32 - r))) & _MASK) ^ a
            a = (a + ks[(i + 1) % 3]) & _MASK
            b = (b + ks[(i + 2) % 3] + i + 1) & _MASK
        out0.append(a)
        out1.append(b)
    shape = np.shape(x0)
    return (
        np.array(out0, np.uint32).reshape(shape),
        np.array(out1, np.uint32).reshape(shape),
    )


def counter_bits(data: np.ndarray, offset: int, num: int) -> tuple:
    """The two uint32 words of Threefry's partitionable random bits for the flat
    indices `offset, ..., offset + num - 1` of a draw with the key `data`: the hash
    of the counter `(index >> 32, index & 0xFFFFFFFF)`, as JAX's
    `threefry_random_bits` computes it (before the words are combined for a bit
    width)."""
    index = np.arange(offset, offset + num, dtype=np.uint64)
    hi = (index >> np.uint64(32)).astype(np.uint32)
    lo = (index & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return threefry2x32(data[0], data[1], hi, lo)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _on_default_device(x: Any) -> bool:
    if not isinstance(x, jax.Array):
        return True
    devices = x.devices()
    return len(devices) == 1 and next(iter(devices)) == jax.devices()[0]


def host_key(key: Any) -> tuple[np.ndarray, bool] | None:
    """`(data, typed)`: the two uint32 words of a concrete scalar threefry key, and
    whether it is a typed key (`jax.random.key`) rather than a raw `uint32[2]` one
    (`jax.random.PRNGKey`). `None` where the fast paths do not apply: a traced key,
    another PRNG implementation, a batch of keys, a key on another device, or
    `jax_threefry_partitionable=False`."""
    if not jax.config.values["jax_threefry_partitionable"] or _is_tracer(key):
        return None
    if not _on_default_device(key):
        return None
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != () or str(jr.key_impl(key)) != _THREEFRY:
            return None
        data = jr.key_data(key)
        if _is_tracer(data):  # a concrete key closed over inside `jit`
            return None
        return np.asarray(data, np.uint32), True
    if jax.config.values["jax_default_prng_impl"] != _THREEFRY:
        return None
    if not isinstance(key, (jax.Array, np.ndarray)) or key.shape != (2,):
        return None
    if key.dtype != np.uint32:
        return None
    return np.asarray(key), False


def _as_key(data: np.ndarray, typed: bool) -> Any:
    if typed:
        # NumPy key data is accepted at run time; the stub asks for a jax.Array
        return jr.wrap_key_data(data, impl=_THREEFRY)  # pyright: ignore[reportArgumentType]
    return jax.device_put(data)


def _check_num(num: Any) -> int:
    try:
        index = None if isinstance(num, (bool, np.bool_)) else operator.index(num)
    except TypeError:
        index = None
    if index is None:
        raise TypeError(
            f"split_keys: `num` must be an int, got {num!r} of type "
            f"{type(num).__name__}; pass the number of keys, e.g. num=4."
        )
    if index < 0:
        raise ValueError(
            f"split_keys: `num` must be non-negative, got {index}; pass the number "
            "of keys, e.g. num=4."
        )
    return index


def split_keys(key: Any, num: int = 2) -> tuple:
    """`tuple(jax.random.split(key, num))`, without compiling a kernel per `num`.

    Bit-identical to `jax.random.split`: the keys are computed on the host
    (Threefry-2x32 in NumPy), so no kernel is compiled per `num` and none for
    unpacking. Falls back to `jax.random.split` for keys it cannot split on the
    host: a traced key (inside `jit`/`vmap`), a PRNG implementation other than
    threefry, `jax_threefry_partitionable=False`, a batch of keys, or a key on a
    non-default device.

    **Arguments:**

    - `key`: a scalar PRNG key, typed (`jax.random.key`) or raw
      (`jax.random.PRNGKey`).
    - `num`: how many keys (a non-negative int).

    **Returns:**

    A tuple (not an array) of `num` keys of the same kind as `key`: unpack it or
    index it as you would `jax.random.split`'s result; `jnp.stack` it where an
    array of keys is needed (for `vmap`).

    >>> import jax
    >>> a, b = split_keys(jax.random.key(0))
    >>> bool((jax.random.key_data(a) == jax.random.key_data(jax.random.split(
    ...     jax.random.key(0))[0])).all())
    True
    """
    num = _check_num(num)
    found = host_key(key)
    if found is None:
        return tuple(jr.split(key, num))
    data, typed = found
    counts = np.arange(num, dtype=np.uint32)
    hi, lo = threefry2x32(data[0], data[1], np.zeros_like(counts), counts)
    pairs = np.stack([hi, lo], axis=-1)
    return tuple(_as_key(pair, typed) for pair in pairs)
