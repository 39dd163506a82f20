"""`MultiheadAttention` and the scaled dot-product attention functions."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .._init import Initializer, split_keys
from .._kernels import Implementation, fusable, fused_attention
from .._module import Module, field
from .._warnings import user_stacklevel
from ._defaults import compute_dtype
from ._dropout import Dropout, resolve_deterministic
from ._input_checks import check_input, layer_name
from ._linear import Linear

_warned_float_mask: list[bool] = []


def _bool_mask(mask: Any, where: str) -> Any:
    """`mask` as booleans: a non-boolean mask is read as Equinox reads it (nonzero
    means "may attend"), with a warning, once, since an additive mask (0 = attend,
    -inf = masked) would then be inverted."""
    if mask is None or jnp.result_type(mask) == jnp.bool_:
        return mask
    if not _warned_float_mask:
        _warned_float_mask.append(True)
        warnings.warn(
            f"{where}: `mask` has dtype {jnp.result_type(mask)}; it is read as "
            "`mask != 0` (nonzero = may attend), as Equinox reads it. If it is an "
            "additive mask (0 = attend, -inf = masked) pass `mask == 0` instead; "
            "pass `mask.astype(bool)` to silence this warning.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return jnp.asarray(mask) != 0


def _softmax_weights(logits: Array, mask: Array | None) -> Array:
    """Softmax over the last axis, in at least float32, of `logits` with the
    positions where `mask` is False set to the dtype's minimum."""
    if mask is not None:
        fill = jnp.finfo(logits.dtype).min
        mask = jnp.broadcast_to(mask, logits.shape)
        logits = jnp.where(mask, logits, jnp.full((), fill, logits.dtype))
    weights = jax.nn.softmax(logits.astype(compute_dtype(logits.dtype)), axis=-1)
    return weights.astype(logits.dtype)


def _dropout_active(dropout: Dropout, inference: bool | None) -> bool:
    """Whether `dropout(x, key=..., inference=inference)` would change `x`."""
    switched_off = dropout.inference if inference is None else inference
    return dropout.p > 0.0 and not switched_off


def _head_weights(q: Array, k: Array, mask: Array | None) -> Array:
    """The `(heads, q_seq, kv_seq)` attention weights of heads laid out
    `(seq, heads, size)`; `mask` broadcasts against the weights."""
    logits = jnp.einsum("qhd,khd->hqk", q / math.sqrt(q.shape[-1]), k)
    return _softmax_weights(logits, mask)


def _fused_heads(
    q: Array, k: Array, v: Array, mask: Array | None, implementation: Implementation
) -> Array:
    """`fused_attention` of one batch of `(seq, heads, size)` heads, with `mask`
    lifted to its 4-d `(batch, heads, q_seq, kv_seq)` form; a `(kv_seq,)` mask of
    the keys every query may attend to is passed as segment ids (all queries in
    segment 1, each key in 1 or 0), which splash attention takes."""
    segment_ids = None
    if mask is not None and jnp.ndim(mask) == 1:
        keys = jnp.asarray(mask, jnp.int32)[None]
        segment_ids, mask = (jnp.ones((1, q.shape[0]), jnp.int32), keys), None
    elif mask is not None:
        mask = jnp.reshape(mask, (1,) * (4 - jnp.ndim(mask)) + jnp.shape(mask))
    out = fused_attention(
        q[None],
        k[None],
        v[None],
        mask=mask,
        segment_ids=segment_ids,
        implementation=implementation,
    )
    return out[0]


def _attend(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    drop: Callable[[Array], Array] | None,
    implementation: Implementation = None,
) -> Array:
    """Attention of `(seq, heads, size)` heads, returned as `(q_seq, heads,
    v_size)`.

    `mask` is `None`, `(kv_seq,)`, `(q_seq, kv_seq)` or `(heads, q_seq, kv_seq)`
    (it broadcasts against the weights); `drop`, if
    given, is applied to the `(heads, q_seq, kv_seq)` weights (dropout), which
    then have to be formed explicitly. Otherwise `jax.nn.dot_product_attention`
    computes the result (`fused_attention`, with `implementation`) when
    `fusable` or asked to.
    """
    if drop is None and (implementation is not None or fusable(q, k, v)):
        return _fused_heads(q, k, v, mask, implementation)
    weights = _head_weights(q, k, mask)
    if drop is not None:
        weights = drop(weights)
    return jnp.einsum("hqk,khd->qhd", weights, v)


def _no_dropout_with(implementation: Implementation, where: str) -> None:
    """Every named implementation computes attention without forming the weights,
    so it cannot drop them out."""
    if implementation is not None:
        raise ValueError(
            f"{where}: `implementation={implementation!r}` computes attention "
            "without dropout on the weights, but `dropout` is active; pass "
            "`implementation=None` (or `inference=True` to switch dropout off)."
        )


def _checked_mask(mask: Any, q_seq: int, kv_seq: int, where: str) -> Array | None:
    mask = _bool_mask(mask, where)
    if mask is not None and jnp.shape(mask) != (q_seq, kv_seq):
        raise ValueError(
            f"{where}: `mask` must have shape (q_seq, kv_seq) = {(q_seq, kv_seq)}, "
            f"got {jnp.shape(mask)}."
        )
    return mask


def dot_product_attention_weights(
    query: Float[Array, "q_seq qk_size"],
    key: Float[Array, "kv_seq qk_size"],
    mask: Bool[Array, "q_seq kv_seq"] | None = None,
) -> Float[Array, "q_seq kv_seq"]:
    """The attention weights `softmax(query @ key.T / sqrt(qk_size))`, with the
    positions where `mask` is False excluded (as `equinox.nn._attention`'s function
    of the same name; the softmax runs in at least float32 and the result has the
    logits' dtype).

    >>> import jax.numpy as jnp
    >>> dot_product_attention_weights(jnp.ones((1, 2)), jnp.ones((3, 2))).shape
    (1, 3)
    """
    query, key = jnp.asarray(query), jnp.asarray(key)
    where = "dot_product_attention_weights"
    mask = _checked_mask(mask, query.shape[0], key.shape[0], where)
    return _head_weights(query[:, None], key[:, None], mask)[0]


def dot_product_attention(
    query: Float[Array, "q_seq qk_size"],
    key_: Float[Array, "kv_seq qk_size"],
    value: Float[Array, "kv_seq v_size"],
    mask: Bool[Array, "q_seq kv_seq"] | None = None,
    dropout: Dropout | None = None,
    *,
    key: PRNGKeyArray | None = None,
    inference: bool | None = None,
    implementation: Implementation = None,
) -> Float[Array, "q_seq v_size"]:
    """Single-head attention: `dot_product_attention_weights(query, key_, mask)`
    (dropped out by `dropout` if given) applied to `value`.

    Without active dropout the result comes from `jax.nn.dot_product_attention`
    when the inputs share one dtype among bfloat16, float32 and (on a GPU only:
    XLA on the CPU and on a TPU refuses its float16 products summed in float32)
    float16, and `v_size == qk_size`; otherwise (float64, mixed dtypes, other
    value sizes, or dropout on the weights) the weights are formed explicitly.

    - `implementation`: `None` (the choice above; without a `mask`, splash
      attention on a TPU for float32/bfloat16 heads whose lengths are multiples
      of 128, cuDNN's flash attention on a GPU for float16/bfloat16 heads it
      takes, XLA's attention otherwise), or `"xla"` / `"cudnn"` to always call
      `jax.nn.dot_product_attention` with that backend (`"cudnn"`: the fused
      cuDNN kernel on an NVIDIA GPU, for the dtypes and shapes cuDNN supports),
      or `"splash"` for the Pallas splash attention kernel (a TPU kernel that
      never forms the weights; other lengths are padded to multiples of 128; a
      call with a `mask` uses XLA's attention; off a TPU it runs in interpret
      mode, slowly, for tests and debugging). It cannot be combined with active
      dropout. (Keyword only.)

    >>> import jax.numpy as jnp
    >>> dot_product_attention(jnp.ones((1, 2)), jnp.ones((3, 2)), jnp.ones((3, 4))).shape
    (1, 4)
    """
    query, key_, value = jnp.asarray(query), jnp.asarray(key_), jnp.asarray(value)
    where = "dot_product_attention"
    mask = _checked_mask(mask, query.shape[0], key_.shape[0], where)
    drop = None
    if dropout is not None and _dropout_active(dropout, inference):
        _no_dropout_with(implementation, where)
        drop = lambda w: dropout(w[0], key=key, inference=inference)[None]
    heads = _attend(
        query[:, None], key_[:, None], value[:, None], mask, drop, implementation
    )
    return heads[:, 0]


ProcessHeads = Callable[
    [
        Float[Array, "q_seq num_heads qk_size"],
        Float[Array, "kv_seq num_heads qk_size"],
        Float[Array, "kv_seq num_heads vo_size"],
    ],
    tuple[Array, Array, Array],
]


def _head_sizes(
    num_heads: int, query_size: int, qk_size: int | None, vo_size: int | None
) -> tuple[int, int]:
    """`(qk_size, vo_size)`, defaulted to `query_size // num_heads`, after checking
    `num_heads` and them."""
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(
            f"MultiheadAttention: `num_heads` must be a positive int, got {num_heads!r}."
        )
    qk_size = query_size // num_heads if qk_size is None else qk_size
    vo_size = query_size // num_heads if vo_size is None else vo_size
    if qk_size < 1 or vo_size < 1:
        raise ValueError(
            f"MultiheadAttention: `qk_size` and `vo_size` must be positive, got "
            f"{qk_size} and {vo_size} (`query_size // num_heads` by default)."
        )
    return qk_size, vo_size


def _projections(
    attn: MultiheadAttention,
    dtype: Any,
    weight_init: Initializer | None,
    bias_init: Initializer | None,
    key: PRNGKeyArray,
) -> tuple[Linear, Linear, Linear, Linear]:
    """The query, key, value and output projections of `attn`, whose size and bias
    fields are already set."""
    qkey, kkey, vkey, okey = split_keys(key, 4)
    inits = dict(weight_init=weight_init, bias_init=bias_init)
    lin = lambda i, o, b, k: Linear(i, o, use_bias=b, dtype=dtype, **inits, key=k)
    h, qk, vo = attn.num_heads, attn.qk_size, attn.vo_size
    return (
        lin(attn.query_size, h * qk, attn.use_query_bias, qkey),
        lin(attn.key_size, h * qk, attn.use_key_bias, kkey),
        lin(attn.value_size, h * vo, attn.use_value_bias, vkey),
        lin(h * vo, attn.output_size, attn.use_output_bias, okey),
    )


class MultiheadAttention(Module):
    r"""Multi-head scaled dot-product attention.

    $$\text{MHA}(Q, K, V) = \sum_{i=1}^h
    \operatorname{softmax}\!\left(\frac{Q W^Q_i (K W^K_i)^\top}{\sqrt{d_\text{qk}}}
    \right) V W^V_i\, W^O_i$$

    Same signature as `equinox.nn.MultiheadAttention`. The four projections are
    [`boxwood.nn.Linear`][] layers with the same initialisation as Equinox's (and
    PyTorch's `Linear`): weights and biases drawn from
    `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`. (PyTorch's `MultiheadAttention` instead
    uses Xavier-uniform input projections and zero biases.)

    Weight layout: `query_proj.weight` has shape `(num_heads * qk_size,
    query_size)` with head `i` in rows `i*qk_size:(i+1)*qk_size`, and likewise for
    the key and value projections. This is PyTorch's layout: with
    `E = embed_dim`, `query_proj.weight = in_proj_weight[:E]`,
    `key_proj.weight = in_proj_weight[E:2E]`, `value_proj.weight =
    in_proj_weight[2E:]`, `output_proj.weight = out_proj.weight`.

    Computation: without active dropout, and when the projected heads share one
    dtype among bfloat16, float32 and (on a GPU only) float16, and `qk_size ==
    vo_size`, the heads go through fused attention (with `implementation=None`:
    on a TPU, splash attention where it applies, with a `(kv_seq,)` padding mask
    or none; on a GPU, cuDNN's flash attention for float16/bfloat16 heads
    without a `mask`; XLA's attention otherwise). Otherwise (dropout on the
    weights, float64, float16 off a GPU, `qk_size != vo_size`) the weights are
    formed explicitly, with the softmax in at least float32. The `implementation`
    field (a constructor keyword) names one instead: `"xla"`, `"cudnn"` or
    `"splash"`.
    """

    query_proj: Linear
    key_proj: Linear
    value_proj: Linear
    output_proj: Linear
    dropout: Dropout
    num_heads: int = field(static=True)
    query_size: int = field(static=True)
    key_size: int = field(static=True)
    value_size: int = field(static=True)
    output_size: int = field(static=True)
    qk_size: int = field(static=True)
    vo_size: int = field(static=True)
    use_query_bias: bool = field(static=True)
    use_key_bias: bool = field(static=True)
    use_value_bias: bool = field(static=True)
    use_output_bias: bool = field(static=True)
    implementation: Implementation = field(static=True, default=None)

    def __init__(
        self,
        num_heads: int,
        query_size: int,
        key_size: int | None = None,
        value_size: int | None = None,
        output_size: int | None = None,
        qk_size: int | None = None,
        vo_size: int | None = None,
        use_query_bias: bool = False,
        use_key_bias: bool = False,
        use_value_bias: bool = False,
        use_output_bias: bool = False,
        dropout_p: float = 0.0,
        inference: bool = False,
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        implementation: Implementation = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `num_heads`: the number of heads $h$.
        - `query_size`: channels of the query input.
        - `key_size`: channels of the key input; defaults to `query_size`.
        - `value_size`: channels of the value input; defaults to `query_size`.
        - `output_size`: channels of the output; defaults to `query_size`.
        - `qk_size`: per-head channels over which queries and keys are compared;
          defaults to `query_size // num_heads`.
        - `vo_size`: per-head channels of the attended values; defaults to
          `query_size // num_heads`.
        - `use_query_bias`, `use_key_bias`, `use_value_bias`, `use_output_bias`:
          whether each projection has a bias.
        - `dropout_p`: dropout probability on the attention weights.
        - `inference`: if `True`, no dropout. Set model-wide by
          [`boxwood.nn.inference_mode`][], or override per call.
        - `dtype`: dtype of the parameters; defaults to float32 (float64 in x64
          mode).
        - `weight_init`, `bias_init`: optional `(key, shape, dtype) -> array`
          functions for the weights and biases of the four projections (see
          [`boxwood.nn.Linear`][]). (Keyword only.)
        - `implementation`: the attention implementation: `None` (boxwood's
          choice, above), `"xla"` or `"cudnn"` (`jax.nn.dot_product_attention`
          with that backend) or `"splash"` (the Pallas splash attention kernel,
          which never forms the weights; off a TPU it runs in interpret mode,
          slowly, for tests and debugging; see docs/models.md). None of the three
          can be combined with active dropout. (Keyword only.)
        - `key`: a `jax.random` key for the initialisation. (Keyword only.)
        """
        qk_size, vo_size = _head_sizes(num_heads, query_size, qk_size, vo_size)
        if implementation not in (None, "xla", "cudnn", "splash"):
            raise ValueError(
                "MultiheadAttention: `implementation` must be None (boxwood's "
                f"choice), 'xla', 'cudnn' or 'splash', got {implementation!r}."
            )
        self.implementation = implementation
        self.num_heads = num_heads
        self.query_size = query_size
        self.key_size = query_size if key_size is None else key_size
        self.value_size = query_size if value_size is None else value_size
        self.output_size = query_size if output_size is None else output_size
        self.qk_size = qk_size
        self.vo_size = vo_size
        self.use_query_bias = bool(use_query_bias)
        self.use_key_bias = bool(use_key_bias)
        self.use_value_bias = bool(use_value_bias)
        self.use_output_bias = bool(use_output_bias)
        projections = _projections(self, dtype, weight_init, bias_init, key)
        self.query_proj, self.key_proj, self.value_proj, self.output_proj = projections
        self.dropout = Dropout(dropout_p, inference=inference)

    def __call__(
        self,
        query: Float[Array, "q_seq query_size"],
        key_: Float[Array, "kv_seq key_size"],
        value: Float[Array, "kv_seq value_size"],
        mask: Bool[Array, "q_seq kv_seq"]
        | Bool[Array, "num_heads q_seq kv_seq"]
        | Bool[Array, " kv_seq"]
        | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
        process_heads: ProcessHeads | None = None,
    ) -> Float[Array, "q_seq output_size"]:
        """**Arguments:**

        - `query`: shape `(q_seq, query_size)`.
        - `key_`: shape `(kv_seq, key_size)`.
        - `value`: shape `(kv_seq, value_size)`.
        - `mask`: optional boolean array of shape `(q_seq, kv_seq)`, or
          `(num_heads, q_seq, kv_seq)` for a mask per head, or `(kv_seq,)` for the
          keys every query may attend to (a padding mask, which splash attention
          takes as segment ids). `True` means "may attend"; `False` positions are
          ignored. A non-boolean mask is read as
          Equinox reads it, `mask != 0`, with a warning (once). (PyTorch's boolean `attn_mask`
          is the opposite: pass `~mask` there.)
        - `key`: a `jax.random` key for dropout (needed only if `dropout_p > 0` and
          not in inference mode). (Keyword only.)
        - `inference`: overrides the dropout's `inference` when not `None`.
        - `deterministic`: deprecated spelling of `inference` (as in Equinox), with
          a `DeprecationWarning`.
        - `process_heads`: optional function mapping the projected
          `(query_heads, key_heads, value_heads)` of shapes `(seq, num_heads,
          size)` to new heads of the same shapes, e.g. to apply
          [`boxwood.nn.RotaryPositionalEmbedding`][].

        **Returns:** an array of shape `(q_seq, output_size)`.
        """
        inference = resolve_deterministic(
            inference, deterministic, "MultiheadAttention()(..., deterministic=...)"
        )
        mask = _bool_mask(mask, "MultiheadAttention")
        self._check_inputs(query, key_, value, mask)
        q = self._split_heads(self.query_proj, query)
        k = self._split_heads(self.key_proj, key_)
        v = self._split_heads(self.value_proj, value)
        if process_heads is not None:
            q, k, v = self._process(process_heads, q, k, v)
        drop = None
        if _dropout_active(self.dropout, inference):
            _no_dropout_with(self.implementation, self._name())
            drop = functools.partial(self._drop_heads, key=key, inference=inference)
        attended = _attend(q, k, v, mask, drop, self.implementation)
        return jax.vmap(self.output_proj)(attended.reshape(attended.shape[0], -1))

    def _drop_heads(self, weights: Array, *, key: Any, inference: Any) -> Array:
        """Dropout on the `(heads, q_seq, kv_seq)` weights, head `i` with the `i`-th
        key of `jax.random.split(key, num_heads)` (so that the masks match
        Equinox's for the same key)."""
        if key is None:  # the dropout layer raises its "needs a random key" error
            return self.dropout(weights, key=None, inference=inference)
        per_head = jax.random.split(key, self.num_heads)
        return jax.vmap(lambda w, k: self.dropout(w, key=k, inference=inference))(
            weights, per_head
        )

    def _split_heads(self, proj: Linear, x: Array) -> Array:
        """`proj` applied to each row of `x`, as `(seq, num_heads, size)`."""
        projected = jax.vmap(proj)(x)
        return projected.reshape(x.shape[0], self.num_heads, -1)

    def _process(
        self, fn: ProcessHeads, q: Array, k: Array, v: Array
    ) -> tuple[Array, Array, Array]:
        new = fn(q, k, v)
        if tuple(x.shape for x in new) != (q.shape, k.shape, v.shape):
            raise ValueError(
                f"{self._name()}: `process_heads` must return query, key and value "
                f"heads of the shapes it was given, {q.shape}, {k.shape}, {v.shape}; "
                f"got {tuple(x.shape for x in new)}."
            )
        new_q, new_k, new_v = new
        return new_q, new_k, new_v

    def _name(self) -> str:
        return layer_name(self, "num_heads", "query_size")

    def _check_inputs(self, query: Any, key_: Any, value: Any, mask: Any) -> None:
        name = self._name()
        check_input(query, ("q_seq", self.query_size), name, what="query")
        check_input(key_, ("kv_seq", self.key_size), name, what="key")
        check_input(value, (key_.shape[0], self.value_size), name, what="value")
        if mask is None:
            return
        q_seq, kv_seq = query.shape[0], key_.shape[0]
        if jnp.ndim(mask) == 3:
            check_input(mask, (self.num_heads, q_seq, kv_seq), name, what="mask")
        elif jnp.ndim(mask) == 1:
            check_input(mask, (kv_seq,), name, what="mask")
        else:
            check_input(mask, (q_seq, kv_seq), name, what="mask")
