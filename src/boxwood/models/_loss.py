"""`causal_lm_loss`: next-token cross entropy computed a chunk of positions at a
time, so the `(positions, vocab_size)` logits never exist whole, forward or
backward."""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._init import ROW, split_keys_of
from ._causal_lm import CausalLM
from ._id_ranges import IGNORE_INDEX, check_labels
from ._inputs import check_attention_mask
from ._loss_chunks import chunked_nll
from ._pretrained import Pretrained
from ._training import dropout_key, stream_key


def causal_lm_loss(
    model: Any,
    input_ids: Int[Array, "*batch seq"],
    labels: Int[Array, "*batch seq"] | None = None,
    *,
    mask: Array | None = None,
    attention_mask: Array | None = None,
    key: Any = None,
    chunk_size: int = 1024,
    predicted_from_padding: bool = False,
) -> Float[Array, ""]:
    """The mean next-token cross entropy of a causal language model, computed
    without ever holding the logits of every position at once.

    The logits are computed from the model's final hidden states and output
    embedding `chunk_size` positions at a time (a batch's rows are joined into
    one stream of positions first), so at most `chunk_size x vocab_size` logits
    exist at once. Each chunk's logits are upcast to float32 (at least) before
    the log-sum-exp, whatever the parameters' dtype. Differentiated, each chunk's
    gradients with respect to the hidden states and the output embedding are
    computed while its logits are at hand, so the backward pass forms no logits
    at all and the head's products run once each, as for the whole logits
    (forward mode and higher derivatives work as usual).

    As `transformers`' `model(input_ids, labels=labels).loss`: position `t`
    predicts `labels[t + 1]` (the shift is done here; the last position predicts
    nothing), labels equal to `-100` are ignored, and the result is the mean over
    the remaining positions of the whole batch (0 when there are none, rather than
    NaN).

    **Arguments:**

    - `model`: a causal language model with `hidden_states(input_ids) -> (seq,
      hidden)` and `output_embedding() -> (vocab_size, hidden)` methods
      (`GPT2LMHeadModel`, `LlamaForCausalLM` and its Mistral, Qwen2 and Gemma
      subclasses).
    - `input_ids`: integer token ids, `(seq,)` or `(batch, seq)` (the model is
      `jax.vmap`ped over the batch).
    - `labels`: the tokens to predict, aligned with `input_ids` (same shape);
      `-100` marks a position to ignore. Defaults to `input_ids`.
    - `mask`: optional, the shape of `input_ids`; positions where it is false (or
      0) are not predicted, like a label of `-100`. It changes only which
      targets count, not what the model attends to.
    - `attention_mask`: optional, the shape of `input_ids`: 1 for real tokens, 0
      for padding (left or right), as a tokenizer returns it. The model attends
      to real tokens only (`model(ids, attention_mask)`), and a position counts
      only where both it and its target are real tokens: padding gets no loss,
      and the mean is over the real targets. With left padding this leaves out
      each row's first real token, which only a pad could predict (see
      `predicted_from_padding`).
    - `key`: a `jax.random` key for dropout; needed when the model is in
      training mode with a nonzero dropout rate (one key per row is split
      from it).
    - `chunk_size`: the number of positions whose logits are computed at once.
    - `predicted_from_padding`: with `attention_mask`, whether a real token that
      follows padding (the first of a left-padded row) counts as a target,
      predicted from the pad before it. `False` (the default): it does not, as
      only real tokens predict. `True`: every real token but a row's first
      column counts, as in `transformers`' usual recipe (`labels` equal to
      `input_ids` with -100 on the pads, and the `attention_mask` given to the
      model). The pad's own output then predicts it, which depends on how
      padding attends: boxwood's pads attend to the pads before them, as in
      `transformers`' Llama family (its GPT-2's average them uniformly: a
      different loss). A left-padded row's loss then differs from that of its
      unpadded sequence, whose first token predicts nothing.
      (Keyword only, as are `mask`, `attention_mask`, `key` and `chunk_size`.)

    **Returns:** a float32 scalar (float64 for float64 models).

    **Raises:** `TypeError` for a `model` without these methods, non-integer
    `labels` or a `chunk_size` that is not an int; `ValueError` for `labels` or
    `mask` of another shape than `input_ids`, a `chunk_size` below 1, or a label
    outside `[0, vocab_size)` other than `-100` (under a trace, a
    `boxwood.BoxwoodRuntimeError` when the computation runs; see
    [`boxwood.models.BertForSequenceClassification`][]`.loss` for the text under
    a plain `jax.jit`).
    """
    _check_model(model)
    size = _check_chunk_size(chunk_size)
    if not isinstance(predicted_from_padding, bool):
        raise TypeError(
            "`causal_lm_loss`: `predicted_from_padding` must be True or False, got "
            f"{predicted_from_padding!r}."
        )
    input_ids = _as_array(input_ids)
    ids = _check_input_ids(input_ids)
    shape = jnp.shape(input_ids)
    attention = None
    if attention_mask is not None:
        if not isinstance(attention_mask, jax.core.Tracer):
            check_attention_mask("`causal_lm_loss`", attention_mask, shape)
        attention = _aligned("attention_mask", attention_mask, shape, ids)
        real = attention.astype(bool)
        previous = jnp.concatenate([jnp.zeros_like(real[:, :1]), real[:, :-1]], 1)
        # the label at `j` is the target of `j - 1`: it counts where both are real
        # (or, predicted from padding, where it is)
        keep = real if predicted_from_padding else real & previous
        if mask is not None:
            keep = keep & _aligned("mask", mask, shape, ids).astype(bool)
        mask = keep.reshape(shape)
    weight = model.output_embedding()
    # Without `labels` the targets are the ids, which a model of boxwood's checks
    # against the same vocabulary under the same trace: one check (a
    # conditional and a host callback in the program), not two.
    checked = labels is None and isinstance(ids, jax.core.Tracer)
    checked = checked and _checks_its_ids(model, weight.shape[0])
    targets = _next_token_targets(
        ids, shape, labels, mask, weight.shape[0], check=not checked
    )
    key = _dropout_key(model, key)
    hidden = _hidden_states(model, ids, attention, key)
    total, count = chunked_nll(
        weight, size, hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    )
    return total / jnp.maximum(count, 1).astype(total.dtype)


def _as_array(input_ids: Any) -> Any:
    """`input_ids`, lists taken as arrays; empty sequences refused, as `generate`
    and the models refuse them."""
    if isinstance(input_ids, list | tuple):
        input_ids = np.asarray(input_ids)
    if jnp.ndim(input_ids) >= 1 and jnp.shape(input_ids)[-1] == 0:
        raise ValueError(
            "`causal_lm_loss`: `input_ids` is empty; give at least one token."
        )
    return input_ids


def _dropout_key(model: Any, key: Any) -> Any:
    """`key`, checked to be given where the dropout of a model of
    `boxwood.models` is active, and converted for its layers (`stream_key`)
    before it is split into the rows' keys, which then need no conversion of
    their own (another model's `key` is passed as it is)."""
    if not isinstance(model, Pretrained):
        return key
    return stream_key(
        dropout_key(model, key, "causal_lm_loss(model, input_ids, key=key)")
    )


def _hidden_states(model: Any, ids: Array, attention: Any, key: Any) -> Array:
    """`(batch, seq, hidden)`: the model's hidden states of each row, with its
    attention mask and its own dropout key (split from `key`)."""
    kwargs: dict[str, Any] = {}
    if key is not None:
        kwargs["key"] = split_keys_of(key, ids.shape[0], ROW)
    if attention is not None:
        kwargs["attention_mask"] = attention
    names = tuple(kwargs)

    def one(row: Array, *extra: Any) -> Array:
        return model.hidden_states(row, **dict(zip(names, extra)))

    return jax.vmap(one)(ids, *kwargs.values())


def _check_model(model: Any) -> None:
    if not all(
        callable(getattr(model, name, None))
        for name in ("hidden_states", "output_embedding")
    ):
        raise TypeError(
            "`causal_lm_loss` takes a causal language model with `hidden_states` and "
            "`output_embedding` methods (such as `GPT2LMHeadModel` or "
            f"`LlamaForCausalLM`), got {type(model).__name__}."
        )


def _check_chunk_size(chunk_size: Any) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
        raise TypeError(
            "`causal_lm_loss`: `chunk_size` must be an int (the number of positions "
            f"whose logits are computed at once), got {chunk_size!r}."
        )
    if chunk_size < 1:
        raise ValueError(
            f"`causal_lm_loss`: `chunk_size` must be at least 1, got {chunk_size}."
        )
    return operator.index(chunk_size)


def _check_input_ids(input_ids: Any) -> Any:
    """`input_ids` as a `(batch, seq)` array (a single sequence gets batch 1)."""
    if jnp.ndim(input_ids) not in (1, 2):
        raise ValueError(
            "`causal_lm_loss`: `input_ids` must have shape (seq,) or (batch, seq), "
            f"got shape {jnp.shape(input_ids)}."
        )
    return jnp.asarray(input_ids).reshape(-1, jnp.shape(input_ids)[-1])


def _aligned(name: str, value: Any, shape: tuple[int, ...], ids: Any) -> Any:
    """`value` (`labels` or `mask`), which must have `input_ids`' `shape`, shaped as
    `ids` `(batch, seq)`."""
    if jnp.shape(value) != shape:
        raise ValueError(
            f"`causal_lm_loss`: `{name}` has shape {jnp.shape(value)} but "
            f"`input_ids` has shape {shape}; give one entry per token, aligned with "
            "`input_ids` (the shift to the next token is done here)."
        )
    return jnp.asarray(value).reshape(ids.shape)


def _checks_its_ids(model: Any, vocab_size: int) -> bool:
    """Whether `model` checks the ids it is given to lie in `[0, vocab_size)`
    (a causal LM of boxwood's, whose config's vocabulary is its output's)."""
    config = getattr(model, "config", None)
    return isinstance(model, CausalLM) and (
        getattr(config, "vocab_size", None) == vocab_size
    )


def _next_token_targets(
    ids: Any,
    shape: tuple[int, ...],
    labels: Any,
    mask: Any,
    vocab_size: int,
    check: bool = True,
) -> Any:
    """`(batch, seq)`: at position `t`, the label of `t + 1`, or `IGNORE_INDEX`;
    the labels that are targets checked to lie in the vocabulary (unless
    `check` is false: the caller knows they are checked)."""
    if labels is None:
        labels = ids
    else:
        if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
            raise TypeError(
                "`causal_lm_loss`: `labels` must be an integer array of token ids "
                f"(-100 to ignore a position), got dtype {jnp.result_type(labels)}."
            )
        labels = _aligned("labels", labels, shape, ids)
    if mask is not None:
        keep = _aligned("mask", mask, shape, ids).astype(bool)
        labels = jnp.where(keep, labels, IGNORE_INDEX)
    targets = labels
    if check:
        # The first label is no target (nothing predicts it): it is not
        # checked. The check sees the labels in the caller's shape, so that it
        # names the position as the caller indexes it.
        first = jnp.full_like(labels[:, :1], IGNORE_INDEX)
        targets = jnp.concatenate([first, labels[:, 1:]], axis=1).reshape(shape)
        targets = check_labels(
            "`causal_lm_loss`", targets, vocab_size, "token ids", "vocab_size"
        )
        targets = targets.reshape(ids.shape)
    last = jnp.full((ids.shape[0], 1), IGNORE_INDEX, labels.dtype)
    return jnp.concatenate([targets[:, 1:], last], axis=1)
