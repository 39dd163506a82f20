"""`jax.nn.initializers` (and so `flax.nnx.initializers`) on the fast path.

Calling `jax.nn.initializers.lecun_normal()(key, shape, dtype)` outside `jit`
compiles its draw and its scaling for every new shape. The common initialisers
are a draw with the prefix property (see `_draw.py`) times a scalar computed from
the shape, so `fast_call` computes that scalar as JAX does, draws on the shared
chunk kernel and multiplies on the host: the same bits as the direct call (tests/init/
test_init_layouts.py checks it), with no compile per shape. It recognises the
closures JAX's factories return (`variance_scaling` and everything built on it:
`lecun_*`, `glorot_*`, `he_*`; `normal`, `uniform`, `truncated_normal`), by their
code object, and only in float32 and float64. The scalar is computed with NumPy on
the CPU backend (the same IEEE arithmetic as XLA's there) and with `jax.numpy` on
other backends (their own `sqrt` and division, as the direct call uses); the
multiplication of the draw by it is IEEE's everywhere.

`orthogonal` is a normal draw followed by a QR decomposition, which is not
elementwise: on the CPU backend, JAX's QR is LAPACK's `geqrf` and `orgqr` from
SciPy's LAPACK (jaxlib loads SciPy's), with the optimal workspace. `_host_qr` calls
the same two routines through `scipy.linalg.lapack`, after checking once per dtype
and process that they give JAX's bits (`_qr_matches_jax`); elsewhere, or if they
do not, the direct call is used.
"""

from __future__ import annotations

import functools
import math
import types
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.nn import initializers as _jinit

from ._draw import draw

try:  # JAX's own fan computation, so that every axis convention matches
    from jax._src.nn.initializers import _compute_fans
except ImportError:  # pragma: no cover - a JAX without it takes the direct call
    _compute_fans = None


def _code(fn: Any) -> types.CodeType:
    # typed as `Initializer` (a protocol without `__code__`): plain closures
    return fn.__code__


#: The code objects of the closures JAX's initialiser factories return.
_CODES: dict[Any, str] = {  # looked up with any object's `__code__`
    _code(_jinit.variance_scaling(1.0, "fan_in", "normal")): "variance_scaling",
    _code(_jinit.normal()): "normal",
    _code(_jinit.uniform()): "uniform",
    _code(_jinit.truncated_normal()): "truncated_normal",
    _code(_jinit.orthogonal()): "orthogonal",
}
_TRUNC_STD = 0.87962566103423978  # JAX's stddev of N(0, 1) truncated to (-2, 2)


def _closure(fn: Any) -> dict[str, Any]:
    cells = fn.__closure__ or ()
    return {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, cells)}


def _variance_scaling(c: dict, key: Any, shape: tuple, dtype: Any) -> Any:
    if _compute_fans is None:
        return None
    try:
        fan_in, fan_out = _compute_fans(
            shape, c["in_axis"], c["out_axis"], c["batch_axis"]
        )
    except (ValueError, IndexError, TypeError):
        return None  # the direct call raises JAX's own error
    denominator = {
        "fan_in": lambda: fan_in,
        "fan_out": lambda: fan_out,
        "fan_avg": lambda: (fan_in + fan_out) / 2,
        "fan_geo_avg": lambda: (fan_in * fan_out) ** 0.5,
    }.get(c["mode"])
    if denominator is None:
        return None
    xp = _scalar_arithmetic()
    variance = xp.asarray(c["scale"] / denominator(), dtype)
    dist = c["distribution"]
    if dist == "truncated_normal":
        factor = xp.sqrt(variance) / xp.asarray(_TRUNC_STD, dtype)
        return _scaled("truncated_normal", key, shape, dtype, factor, -2, 2)
    if dist == "normal":
        return _scaled("normal", key, shape, dtype, xp.sqrt(variance))
    if dist == "uniform":
        factor = xp.sqrt(xp.asarray(3, dtype) * variance)
        return _scaled("uniform", key, shape, dtype, factor, -1, 1.0)
    return None


def _scalar_arithmetic() -> Any:
    """The module that computes a variance-scaling factor as JAX's direct call does
    on this backend: NumPy on the CPU, where XLA's scalar `sqrt` and division are
    IEEE's correctly rounded ones as NumPy's are; `jax.numpy` elsewhere, so that
    the factor is the backend's own (a GPU's `sqrt` or division may differ from
    IEEE's by an ulp, and the direct call computes the factor on the GPU)."""
    return np if jax.default_backend() == "cpu" else jnp


def _host_qr(z: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`(q, diagonal of r)` of the reduced QR of `z` (rows >= columns), with the
    LAPACK routines and workspace that JAX's CPU QR uses; `None` if LAPACK reports
    a failure (the direct call then serves)."""
    from scipy.linalg import lapack

    prefix = "s" if z.dtype == np.float32 else "d"
    geqrf, orgqr = getattr(lapack, prefix + "geqrf"), getattr(lapack, prefix + "orgqr")
    lwork = int(geqrf(z, lwork=-1)[2][0])
    qr, tau, _, info = geqrf(z, lwork=lwork)
    if info != 0:
        return None
    k = z.shape[1]
    lwork = int(orgqr(qr[:, :k], tau, lwork=-1)[1][0])
    q, _, info = orgqr(qr[:, :k], tau, lwork=lwork)
    if info != 0:
        return None
    return q, np.diagonal(qr)[:k].copy()


def _jax_qr(z: Any) -> tuple[Any, Any]:
    """`(q, diagonal of r)` from `jnp.linalg.qr`, one compile for both."""
    q, r = jnp.linalg.qr(z)
    return q, jnp.diagonal(r)


@functools.cache
def _qr_matches_jax(dtype: np.dtype) -> bool:
    """Whether `_host_qr` gives `jnp.linalg.qr`'s bits here (one small QR compiled
    once per dtype and process; `False` off the CPU backend or without SciPy)."""
    if jax.default_backend() != "cpu":
        return False
    try:
        z = np.asarray(np.random.default_rng(0).standard_normal((70, 40)), dtype)
        host = _host_qr(z)
        if host is None:
            return False
        q, d = host
        jq, jd = jax.jit(_jax_qr)(z)
        return bool(np.array_equal(q, np.asarray(jq)) and np.array_equal(d, jd))
    except Exception:  # no SciPy, or LAPACK refused: the direct call serves
        return False


def _orthogonal(c: dict, key: Any, shape: tuple, dtype: Any) -> Any:
    """JAX's `orthogonal()(key, shape, dtype)`: a normal draw on the chunk kernel,
    QR on the host (see the module doc), the signs of `r`'s diagonal, JAX's
    reshaping and scale."""
    if len(shape) < 2 or 0 in shape or not _qr_matches_jax(dtype):
        return None
    axis = c["column_axis"]
    try:
        n_cols = shape[axis]
    except (IndexError, TypeError):
        return None  # the direct call raises JAX's own error
    n_rows = math.prod(shape) // n_cols
    z = np.asarray(
        draw("normal", key, (max(n_rows, n_cols), min(n_rows, n_cols)), dtype)
    )
    host = _host_qr(z)
    if host is None:
        return None
    q, d = host
    x = q * np.sign(d)[None, :]
    if n_rows < n_cols:
        x = x.T
    x = np.reshape(x, tuple(np.delete(shape, axis)) + (n_cols,))
    x = np.moveaxis(x, -1, axis)
    return jax.device_put(np.asarray(c["scale"], dtype) * x)


def _scaled(dist: str, key: Any, shape: tuple, dtype: Any, factor: Any, *params):
    values = np.asarray(draw(dist, key, shape, dtype, *params))
    return jax.device_put(values * np.asarray(factor, dtype))


def fast_call(fn: Any, key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """`fn(key, shape, dtype)`, bit for bit, without a compile per shape where `fn`
    is one of JAX's recognised initialisers; `None` where it is not (call `fn`)."""
    kind = _CODES.get(getattr(fn, "__code__", None))
    if kind is None or isinstance(key, jax.core.Tracer):
        return None
    dtype = jnp.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    shape = tuple(int(s) for s in shape)
    c = _closure(fn)
    if kind == "variance_scaling":
        return _variance_scaling(c, key, shape, dtype)
    if kind == "orthogonal":
        return _orthogonal(c, key, shape, dtype)
    if kind == "normal":
        return _scaled("normal", key, shape, dtype, c["stddev"])
    if kind == "uniform":
        return _scaled("uniform", key, shape, dtype, c["scale"], 0.0, 1.0)
    return _scaled(
        "truncated_normal", key, shape, dtype, c["stddev"], c["lower"], c["upper"]
    )


def call_initializer(fn: Any, key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """`fn(key, shape, dtype)`, on the fast path where `fast_call` knows `fn`."""
    out = fast_call(fn, key, shape, dtype)
    return fn(key, shape, dtype) if out is None else out
