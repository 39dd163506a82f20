"""The summed next-token negative log-likelihood of `causal_lm_loss`, a chunk of
positions at a time, with its derivative computed in the same pass.

The logits `hidden @ weight.T` of `chunk_size` positions exist at once, never the
whole `(positions, vocab)` array. Differentiated, the chunks' gradients with
respect to `hidden` and `weight` are computed while each chunk's logits are at
hand (a `jax.custom_jvp` whose tangent is their inner product with the inputs'
tangents), so reverse mode keeps only those gradients for the backward pass and
forms no logits there: the head's three products (logits, and the two of their
cotangent) run once each, as for the whole logits, where letting JAX
differentiate a checkpointed chunk would compute the logits a second time.
Forward mode and higher derivatives hold, since the gradients are themselves
computed by differentiable code."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array, Float, Int

from ._attend import wide_dtype
from ._id_ranges import IGNORE_INDEX


def chunked_nll(
    weight: Float[Array, "vocab hidden"],
    chunk_size: int,
    hidden: Float[Array, "n hidden"],
    targets: Int[Array, " n"],
) -> tuple[Array, Array]:
    """The summed negative log-likelihood of `targets` `(n,)` (`IGNORE_INDEX`:
    not counted) given `hidden` `(n, hidden)` and the output embedding `weight`,
    and how many targets count."""
    n = hidden.shape[0]
    size = max(1, min(chunk_size, n))
    counted = jnp.sum(targets != IGNORE_INDEX)
    return _nll_sum(size, weight, hidden, targets), counted


def _chunks(size: int, hidden: Array, targets: Array) -> tuple[Array, Array]:
    """`hidden` and `targets` padded to whole chunks of `size`, `(chunks, size,
    ...)`; padding is never counted."""
    n = hidden.shape[0]
    pad = -n % size
    hidden = jnp.pad(hidden, ((0, pad), (0, 0)))
    targets = jnp.pad(targets, (0, pad), constant_values=IGNORE_INDEX)
    return hidden.reshape(-1, size, hidden.shape[-1]), targets.reshape(-1, size)


def _logits(hidden: Array, weight: Array) -> Array:
    """A chunk's logits, upcast for the log-sum-exp after the product, which runs
    in the model's dtype as its own head computes it."""
    logits = jnp.tensordot(hidden, weight, axes=(-1, -1))  # hidden @ weight.T
    return logits.astype(wide_dtype(logits.dtype))


def _chunk_nll(
    hidden: Array, targets: Array, weight: Array
) -> tuple[Array, tuple[Array, Array]]:
    """A chunk's summed negative log-likelihood, and its log-sum-exp and logits
    (for the gradient)."""
    logits = _logits(hidden, weight)
    counted = targets != IGNORE_INDEX
    safe = jnp.where(counted, targets, 0)
    picked = jnp.take_along_axis(logits, safe[:, None], axis=-1)[:, 0]
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum(jnp.where(counted, lse - picked, 0.0)), (logits, lse)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _nll_sum(size: int, weight: Array, hidden: Array, targets: Array) -> Array:
    chunks = _chunks(size, hidden, targets)
    totals = lax.map(lambda xs: _chunk_nll(xs[0], xs[1], weight)[0], chunks)
    return jnp.sum(totals)


def _nll_and_gradients(
    size: int,
    weight: Array,
    hidden: Array,
    targets: Array,
    want_hidden: bool,
    want_weight: bool,
) -> tuple[Array, Array | None, Array | None]:
    """`_nll_sum` with its gradients with respect to `hidden` and `weight` (those
    wanted), in their dtypes. A chunk's cotangent of its logits (softmax minus
    the one-hot target, on counted rows) is cast to the product's dtype before
    its two products, as JAX's own derivative of the upcast would cast it. The
    weight's gradient is summed over the chunks in its own dtype, as JAX's
    derivative of a loop over the chunks sums it (each chunk's product in the
    wide dtype, rounded once): a wide sum would move twice the bytes of a
    `(vocab, hidden)` array per chunk, on a TPU as much time as the product."""
    n = hidden.shape[0]
    chunked_hidden, chunked_targets = _chunks(size, hidden, targets)
    product = jnp.result_type(hidden, weight)
    wide = wide_dtype(product)

    def step(g_weight: Any, xs: tuple[Array, Array]) -> tuple[Any, Any]:
        h, t = xs
        total, (logits, lse) = _chunk_nll(h, t, weight)
        counted = (t != IGNORE_INDEX)[:, None]
        vocab = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        target = vocab == jnp.where(counted, t[:, None], -1)
        d_logits = jnp.exp(logits - lse[:, None]) - target.astype(wide)
        d_logits = jnp.where(counted, d_logits, 0.0).astype(product)
        g_h = None
        if want_hidden:
            g_h = jnp.tensordot(d_logits, weight, 1, preferred_element_type=wide)
            g_h = g_h.astype(hidden.dtype)
        if want_weight:
            # d_logits.T @ h, contracted as they lie (no transpose)
            g_w = jnp.tensordot(d_logits, h, (0, 0), preferred_element_type=wide)
            g_weight = (g_weight.astype(wide) + g_w).astype(weight.dtype)
        return g_weight, (total, g_h)

    start = jnp.zeros_like(weight) if want_weight else None
    g_weight, (totals, g_hidden) = lax.scan(
        step, start, (chunked_hidden, chunked_targets)
    )
    if want_hidden:
        g_hidden = g_hidden.reshape(-1, hidden.shape[-1])[:n]
    return jnp.sum(totals), g_hidden, g_weight


def _inner(gradient: Array, tangent: Array, dtype: Any) -> Array:
    """`sum(gradient * tangent)` accumulated in `dtype`; one contraction of the
    two arrays as they are, so that differentiating it keeps `gradient` in its
    own dtype for the backward pass."""
    axes = tuple(range(gradient.ndim))
    return lax.dot_general(
        gradient, tangent.astype(gradient.dtype), ((axes, axes), ((), ())),
        preferred_element_type=dtype,
    )  # fmt: skip


def _nll_sum_jvp(
    size: int, primals: tuple[Array, Array, Array], tangents: tuple[Any, Any, Any]
) -> tuple[Array, Array]:
    weight, hidden, targets = primals
    d_weight, d_hidden, _ = tangents
    want_weight = not isinstance(d_weight, SymbolicZero)
    want_hidden = not isinstance(d_hidden, SymbolicZero)
    total, g_hidden, g_weight = _nll_and_gradients(
        size, weight, hidden, targets, want_hidden, want_weight
    )
    tangent = jnp.zeros((), total.dtype)
    if g_hidden is not None:
        tangent = tangent + _inner(g_hidden, d_hidden, total.dtype)
    if g_weight is not None:
        tangent = tangent + _inner(g_weight, d_weight, total.dtype)
    return total, tangent


_nll_sum.defjvp(_nll_sum_jvp, symbolic_zeros=True)
