"""Sequence classification over a causal language model's body:
`GPT2ForSequenceClassification` and `LlamaForSequenceClassification`, a linear
`score` (no bias) read at the last token that is not padding, as `transformers`
reads it."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import split_keys
from ..nn import Linear
from . import _training as training
from ._attention import Implementation
from ._classification import classification_loss
from ._gpt2 import GPT2Config, GPT2LMHeadModel
from ._llama import LlamaConfig, LlamaForCausalLM

_SCORE = r"score\..*"


def last_real_token(input_ids: Array, pad_token_id: int | None) -> Array:
    """The index `transformers` reads a sequence's class at: the last token that
    is not `pad_token_id` (the first when all are; the last token when the
    config has no pad id)."""
    seq = input_ids.shape[0]
    if pad_token_id is None:
        return jnp.asarray(seq - 1)
    return jnp.argmax(jnp.where(input_ids != pad_token_id, jnp.arange(seq), 0))


def _scored(model: Any, input_ids: Any, attention_mask: Any, key: Any) -> Array:
    """`model.score` of the final hidden state of the last real token."""
    hidden = model.hidden_states(input_ids, attention_mask, key=key)
    at = last_real_token(jnp.asarray(input_ids), model.config.pad_token_id)
    return model.score(hidden[at])


def _loss(model: Any, logits: Array, labels: Array) -> Array:
    where = f"{type(model).__name__}.loss"
    return classification_loss(logits, labels, model.config.problem_type, where)


_CALL_DOC = """**Arguments:** as the causal language model takes them.

        **Returns:** the logits (or regression outputs), `(num_labels,)`.
        """
_LOSS_DOC = """The loss `transformers` computes for these logits, chosen by
        `problem_type` as [`boxwood.models.BertForSequenceClassification`][]`.loss`
        chooses it, with its checks of the class ids."""


def _score(config: Any, width: int, dtype: Any, key: Any) -> Linear:
    return training.linear(
        width,
        config.num_labels,
        dtype or jnp.float32,
        config.initializer_range,
        key=key,
        bias=False,
    )


class GPT2ForSequenceClassification(GPT2LMHeadModel):
    """GPT-2 classifying (or scoring) a whole sequence: a linear `score` without
    bias from each token's final hidden state to `num_labels` logits, read at the
    last token that is not `config.pad_token_id` (right padding; the last token
    when the config has no pad id), as `transformers`' class does. Its body is
    `GPT2LMHeadModel`'s (`transformer`), and its loss is
    [`boxwood.models.BertForSequenceClassification`][]`.loss`'s."""

    score: Linear

    ARCHITECTURE: ClassVar[str | None] = "GPT2ForSequenceClassification"
    NEW_ON_LOAD: ClassVar[str | None] = _SCORE
    OTHER_HEADS: ClassVar[str | None] = None

    def __init__(
        self,
        config: GPT2Config,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        attention_implementation: Implementation = None,
    ):
        """**Arguments:** as [`boxwood.models.GPT2LMHeadModel`][] takes them;
        `config.labels` (`id2label`) gives the number of outputs."""
        k1, k2 = split_keys(key, 2)
        super().__init__(
            config, dtype, key=k1, attention_implementation=attention_implementation
        )
        self.score = _score(config, config.n_embd, dtype, k2)

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " num_labels"]:
        return _scored(self, input_ids, attention_mask, key)

    __call__.__doc__ = _CALL_DOC

    def loss(
        self, logits: Float[Array, "*batch num_labels"], labels: Array
    ) -> Float[Array, ""]:
        return _loss(self, logits, labels)

    loss.__doc__ = _LOSS_DOC


class LlamaForSequenceClassification(LlamaForCausalLM):
    """A Llama-family model classifying (or scoring) a whole sequence, as
    [`boxwood.models.GPT2ForSequenceClassification`][] (a bias-free `score`
    at the last token that is not `config.pad_token_id`) over
    `LlamaForCausalLM`'s body (`model`), without its `lm_head` (`None`)."""

    score: Linear

    ARCHITECTURE: ClassVar[str | None] = "LlamaForSequenceClassification"
    NEW_ON_LOAD: ClassVar[str | None] = _SCORE
    OTHER_HEADS: ClassVar[str | None] = r"lm_head\..*"

    def __init__(
        self,
        config: LlamaConfig,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        attention_implementation: Implementation = None,
    ):
        """**Arguments:** as [`boxwood.models.LlamaForCausalLM`][] takes them;
        `config.labels` (`id2label`) gives the number of outputs."""
        k1, k2 = split_keys(key, 2)
        tied = dataclasses.replace(config, tie_word_embeddings=True)  # no lm_head
        super().__init__(
            tied, dtype, key=k1, attention_implementation=attention_implementation
        )
        self.config = config
        self.score = _score(config, config.hidden_size, dtype, k2)

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " num_labels"]:
        return _scored(self, input_ids, attention_mask, key)

    __call__.__doc__ = _CALL_DOC

    def loss(
        self, logits: Float[Array, "*batch num_labels"], labels: Array
    ) -> Float[Array, ""]:
        return _loss(self, logits, labels)

    loss.__doc__ = _LOSS_DOC
