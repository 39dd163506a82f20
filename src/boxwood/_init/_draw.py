"""Fast random draws: no compiled kernel per shape, values bit-identical to the
`jax.random` call they replace.

Why: outside `jit`, each `jax.random.uniform(key, shape)` compiles an XLA kernel for
that shape (0.1-0.8 s each on a 2-core machine), and a model's constructor draws
many shapes. With `jax_threefry_partitionable=True` (JAX's default) element `i`
of a draw depends only on the key and on its flat index `i`. So a kernel that turns
a fixed-size *chunk* of elements starting at an offset into values serves every
shape: a parameter of `n` elements is `ceil(n / CHUNK)` calls of the same kernel,
joined on the host and put back on the device.

Two kernels per (distribution, dtype), chosen per draw:

- *host bits* (the first `HOST_BITS_LIMIT` elements a process draws): the Threefry
  hash of the counters is computed in NumPy (`_keys.counter_bits`), and the kernel
  only turns those bits into values, a handful of elementwise operations that XLA
  compiles several times faster than the hash. A small model never compiles the
  hash at all.
- *device bits* (everything after): the kernel hashes the counters itself, on a key
  of a private PRNG implementation (`_CHUNK_IMPL`) whose random bits are
  Threefry's at `offset + i`. Its one larger compile is paid once, where hashing
  on the host would cost more than compiling.

Either way the kernel calls the very `jax.random` function it replaces, so the
float arithmetic (scaling, `erf_inv`, clipping) is JAX's own. Where the premise
does not hold the draw falls back to the direct call: see `_fast_ok`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl, threefry2x32_p

from .._shape import as_shape
from ._keys import counter_bits, host_key

#: Elements drawn per kernel call.
CHUNK = 1 << 15
#: Larger draws go to `jax.random` directly: their compile is small next to the
#: work, and the host round trip would not pay.
MAX_FAST_SIZE = 1 << 22
#: Elements a process hashes on the host before its draws move to the device-bits
#: kernel (about the time one compile of the hash takes, on a 2-core machine).
HOST_BITS_LIMIT = 1 << 22

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_host_hashed = 0  # elements hashed on the host so far in this process


def _combine(bits1: Any, bits2: Any, bit_width: int) -> Any:
    """The random bits of width `bit_width` from Threefry's two output words, as
    `threefry_random_bits` combines them."""
    dtype = _UINT[bit_width]
    if bit_width == 64:
        high = lax.convert_element_type(bits1, dtype)
        low = lax.convert_element_type(bits2, dtype)
        return lax.shift_left(high, jnp.asarray(32, dtype)) | low
    if bit_width == 32:
        return bits1 ^ bits2
    return lax.convert_element_type(bits1 ^ bits2, dtype)


def _chunk_bits(data: Any, bit_width: int, shape: tuple[int, ...]) -> Any:
    """Threefry's partitionable random bits (as `threefry_random_bits` computes them)
    for the flat indices `offset + i`; `data` is `(k0, k1, offset_lo, offset_hi)`."""
    n = math.prod(shape)
    lo = lax.iota(np.uint32, n) + data[2]
    hi = jnp.broadcast_to(data[3], (n,)) + (lo < data[2]).astype(np.uint32)
    bits1, bits2 = threefry2x32_p.bind(data[0], data[1], hi, lo)
    return _combine(bits1.reshape(shape), bits2.reshape(shape), bit_width)


def _given_bits(data: Any, bit_width: int, shape: tuple[int, ...]) -> Any:
    """The random bits carried by the key itself: `data` is Threefry's two output
    words, computed on the host, for `CHUNK` flat indices."""
    return _combine(data[0].reshape(shape), data[1].reshape(shape), bit_width)


def _unsupported(*args: Any) -> Any:
    raise NotImplementedError("boxwood's chunk keys only draw random bits.")


def _bits_only_impl(key_shape: tuple, random_bits: Any, name: str, tag: str) -> Any:
    """A PRNG implementation whose keys only draw random bits."""
    return define_prng_impl(
        key_shape=key_shape,
        seed=_unsupported,
        split=_unsupported,
        random_bits=random_bits,
        fold_in=_unsupported,
        name=name,
        tag=tag,
    )


_CHUNK_IMPL = _bits_only_impl((4,), _chunk_bits, "boxwood_chunk", "bwc")
_BITS_IMPL = _bits_only_impl((2, CHUNK), _given_bits, "boxwood_bits", "bwb")


def _uniform(key: Any, shape: tuple, dtype: Any, minval: Any, maxval: Any) -> Any:
    return jr.uniform(key, shape, dtype, minval, maxval)


def _normal(key: Any, shape: tuple, dtype: Any) -> Any:
    return jr.normal(key, shape, dtype)


def _truncated_normal(
    key: Any, shape: tuple, dtype: Any, lower: Any, upper: Any
) -> Any:
    return jr.truncated_normal(key, lower, upper, shape, dtype)


#: The distributions with the prefix property (checked over shapes, dtypes and key
#: kinds in tests/init/test_init.py), as `(key, shape, dtype, *params) -> array`.
DISTRIBUTIONS: dict[str, Callable[..., Any]] = {
    "uniform": _uniform,
    "normal": _normal,
    "truncated_normal": _truncated_normal,
}


@functools.lru_cache(maxsize=64)
def _kernel(dist: str, dtype: np.dtype, host_bits: bool) -> Callable[..., Any]:
    """The compiled chunk kernel for `dist` in `dtype`, taking the host's random
    bits (`host_bits`) or hashing the counters itself (bounded cache: at most two
    entries per distribution and dtype, and at most 64)."""
    draw = DISTRIBUTIONS[dist]
    impl = _BITS_IMPL if host_bits else _CHUNK_IMPL

    def kernel(data: Any, *params: Any) -> Any:
        key = jr.wrap_key_data(data, impl=impl)
        return draw(key, (CHUNK,), dtype, *params)

    return jax.jit(kernel)


def _fast_ok(shape: tuple[int, ...], dtype: np.dtype, params: tuple) -> bool:
    """Whether the chunk kernel can draw this: a floating dtype, at most
    `MAX_FAST_SIZE` elements, and scalar parameters (an array of bounds is
    broadcast against the whole shape, which a chunk does not have)."""
    return (
        jnp.issubdtype(dtype, jnp.floating)
        and math.prod(shape) <= MAX_FAST_SIZE
        and all(np.ndim(p) == 0 for p in params)
    )


def _host_words(data: np.ndarray, offset: int, num: int) -> np.ndarray:
    words = np.zeros((2, CHUNK), np.uint32)
    words[0, :num], words[1, :num] = counter_bits(data, offset, num)
    return words


def _draw_chunks(dist: str, data: np.ndarray, size: int, dtype: Any, params: tuple):
    global _host_hashed
    host_bits = _host_hashed + size <= HOST_BITS_LIMIT
    kernel = _kernel(dist, dtype, host_bits)
    parts = []
    for offset in range(0, size, CHUNK):
        if host_bits:
            words = _host_words(data, offset, min(CHUNK, size - offset))
        else:
            words = np.array([data[0], data[1], offset, 0], np.uint32)
        out = kernel(words, *params)
        if isinstance(out, jax.core.Tracer):  # called under a trace
            return None
        parts.append(out)
    if host_bits:
        _host_hashed += size
    return np.concatenate([np.asarray(p) for p in parts])[:size]


def draw(dist: str, key: Any, shape: Any, dtype: Any, *params: Any) -> jax.Array:
    """`DISTRIBUTIONS[dist](key, shape, dtype, *params)`, bit for bit, from the
    shared chunk kernel where it can.

    It falls back to the direct `jax.random` call for a traced key (inside `jit` or
    `vmap` there is nothing to save), a non-threefry PRNG implementation,
    `jax_threefry_partitionable=False`, a key on another device, a non-floating
    dtype, parameters that are arrays rather than scalars (bounds per element), or
    more than `MAX_FAST_SIZE` elements.

    **Arguments:**

    - `dist`: `"uniform"`, `"normal"` or `"truncated_normal"`.
    - `key`: a scalar PRNG key, typed or raw.
    - `shape`, `dtype`: as for `jax.random`.
    - `*params`: the distribution's parameters (`minval, maxval` or `lower, upper`),
      passed on exactly as given.

    **Returns:**

    The array `jax.random` would return.

    >>> import jax, jax.numpy as jnp
    >>> key = jax.random.key(0)
    >>> fast = draw("uniform", key, (3, 5), jnp.float32, -1.0, 1.0)
    >>> bool((fast == jax.random.uniform(key, (3, 5), jnp.float32, -1.0, 1.0)).all())
    True
    """
    shape = as_shape(shape, dist)
    dtype = jnp.dtype(jax.dtypes.canonicalize_dtype(dtype))
    found = host_key(key) if _fast_ok(shape, dtype, params) else None
    if found is not None:
        size = math.prod(shape)
        flat = (
            np.zeros((0,), dtype)
            if size == 0
            else _draw_chunks(dist, found[0], size, dtype, params)
        )
        if flat is not None:
            return jax.device_put(flat.reshape(shape))
    return DISTRIBUTIONS[dist](key, shape, dtype, *params)


def uniform(
    key: Any, shape: Any, dtype: Any = float, minval: Any = 0.0, maxval: Any = 1.0
) -> jax.Array:
    """`jax.random.uniform(key, shape, dtype, minval, maxval)`, bit for bit, without
    compiling a kernel per shape (see `boxwood.random`).

    >>> import jax
    >>> uniform(jax.random.key(0), (2, 3), minval=-0.5, maxval=0.5).shape
    (2, 3)
    """
    return draw("uniform", key, shape, dtype, minval, maxval)


def normal(key: Any, shape: Any, dtype: Any = float) -> jax.Array:
    """`jax.random.normal(key, shape, dtype)`, bit for bit, without compiling a
    kernel per shape (see `draw`).

    >>> import jax
    >>> normal(jax.random.key(0), (4,)).dtype
    dtype('float32')
    """
    return draw("normal", key, shape, dtype)


def truncated_normal(
    key: Any, lower: Any, upper: Any, shape: Any, dtype: Any = float
) -> jax.Array:
    """`jax.random.truncated_normal(key, lower, upper, shape, dtype)`, bit for bit,
    without compiling a kernel per shape (see `boxwood.random`).

    >>> import jax
    >>> truncated_normal(jax.random.key(0), -2.0, 2.0, (4,)).shape
    (4,)
    """
    return draw("truncated_normal", key, shape, dtype, lower, upper)
