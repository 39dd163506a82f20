"""Sequence classification over a causal language model's body:
`GPT2ForSequenceClassification` and `LlamaForSequenceClassification`, a linear
`score` (no bias) read at the last token that is not padding, as `transformers`
reads it."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, cast

import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import split_keys
from ..nn import Linear
from . import _training as training
from ._attend import Implementation
from ._blocks import with_every_layer
from ._causal_lm import CausalLM
from ._classification import classification_loss
from ._gpt2 import GPT2LMHeadModel
from ._llama import LlamaForCausalLM


def last_real_token(input_ids: Array, pad_token_id: int | None) -> Array:
    """The index `transformers` reads a sequence's class at: the last token that
    is not `pad_token_id` (the first when all are; the last token when the
    config has no pad id)."""
    seq = input_ids.shape[0]
    if pad_token_id is None:
        return jnp.asarray(seq - 1)
    return jnp.argmax(jnp.where(input_ids != pad_token_id, jnp.arange(seq), 0))


class SequenceClassifierHead(CausalLM):
    """What the sequence classifiers share, whatever the causal language model
    they are built on (the next base in a subclass's MRO): its body without an
    output projection (the config's `tie_word_embeddings` set for the body, so
    Llama's `lm_head` is `None`), and a bias-free `score` to `num_labels`
    outputs read at the last real token."""

    score: Linear

    NEW_ON_LOAD: ClassVar[str | None] = r"score\..*"
    GENERATES: ClassVar[bool] = False  # a classifier

    def __init__(
        self,
        config: Any,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        attention_implementation: Implementation = None,
    ):
        """**Arguments:** as the language model this class is built on takes
        them ([`boxwood.models.GPT2LMHeadModel`][],
        [`boxwood.models.LlamaForCausalLM`][]); `config.labels` (`id2label`)
        gives the number of outputs."""
        k1, k2 = split_keys(key, 2)
        body = dataclasses.replace(config, tie_word_embeddings=True)  # no lm_head
        # the language model's own `__init__`, next in the subclass's MRO
        cast(Any, super()).__init__(
            body, dtype, key=k1, attention_implementation=attention_implementation
        )
        model: Any = self  # the language model's fields and methods
        model.config = config
        width = model.output_embedding().shape[1]
        self.score = training.linear(
            width,
            config.num_labels,
            dtype or jnp.float32,
            config.initializer_range,
            key=k2,
            bias=False,
        )

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Any = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as the causal language model takes them.

        **Returns:** the logits (or regression outputs), `(num_labels,)`: the
        `score` of the final hidden state of the last token that is not
        `config.pad_token_id`; with `output_hidden_states`, `(logits,
        hidden_states)` as the language model returns them.
        """
        every = bool(output_hidden_states)
        hidden, _, layers = self._hidden(
            input_ids, None, 0, None, None, attention_mask, key, every
        )
        pad = cast(Any, self).config.pad_token_id
        at = last_real_token(jnp.asarray(input_ids), pad)
        logits = self.score(hidden[at])
        return with_every_layer(logits, layers)

    def loss(
        self, logits: Float[Array, "*batch num_labels"], labels: Array
    ) -> Float[Array, ""]:
        """The loss `transformers` computes for these logits, chosen by
        `problem_type` as [`boxwood.models.BertForSequenceClassification`][]`.loss`
        chooses it, with its checks of the class ids."""
        where = f"{type(self).__name__}.loss"
        problem = cast(Any, self).config.problem_type
        return classification_loss(logits, labels, problem, where)


class GPT2ForSequenceClassification(SequenceClassifierHead, GPT2LMHeadModel):
    """GPT-2 classifying (or scoring) a whole sequence: a linear `score` without
    bias from each token's final hidden state to `num_labels` logits, read at the
    last token that is not `config.pad_token_id` (right padding; the last token
    when the config has no pad id), as `transformers`' class does. Its body is
    `GPT2LMHeadModel`'s (`transformer`), and its loss is
    [`boxwood.models.BertForSequenceClassification`][]`.loss`'s."""

    ARCHITECTURE: ClassVar[str | None] = "GPT2ForSequenceClassification"
    OTHER_HEADS: ClassVar[str | None] = None


class LlamaForSequenceClassification(SequenceClassifierHead, LlamaForCausalLM):
    """A Llama-family model classifying (or scoring) a whole sequence, as
    [`boxwood.models.GPT2ForSequenceClassification`][] (a bias-free `score`
    at the last token that is not `config.pad_token_id`) over
    `LlamaForCausalLM`'s body (`model`), without its `lm_head` (`None`)."""

    ARCHITECTURE: ClassVar[str | None] = "LlamaForSequenceClassification"
    OTHER_HEADS: ClassVar[str | None] = r"lm_head\..*"
