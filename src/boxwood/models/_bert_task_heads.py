"""BERT's span and choice heads over `BertModel`: `BertForQuestionAnswering`
(start and end logits of an answer span) and `BertForMultipleChoice` (one score
per choice), with the names, initialisation, dropout and losses of
`transformers`' classes."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import ROW, split_keys_of, stream_key
from ..nn import Linear
from . import _training as training
from ._bert import BertConfig
from ._bert_heads import (
    CLASSIFIER,
    NEXT_SENTENCE,
    POOLER,
    PREDICTIONS,
    QUESTION_ANSWERING,
    BertClassifierHead,
    BertHead,
    any_of,
)
from ._blocks import with_every_layer
from ._classification import classification_loss, classifier_layer
from ._model_config import ConfigError


class BertForQuestionAnswering(BertHead):
    """BERT finding an answer span (extractive question answering, SQuAD): a
    linear `qa_outputs` from each token's last hidden state to two logits, the
    answer's start and its end. No pooler, no dropout of its own (as
    `transformers`)."""

    qa_outputs: Linear

    ARCHITECTURE: ClassVar[str | None] = "BertForQuestionAnswering"
    NEW_ON_LOAD: ClassVar[str | None] = QUESTION_ANSWERING
    OTHER_HEADS: ClassVar[str | None] = any_of(
        POOLER, PREDICTIONS, NEXT_SENTENCE, CLASSIFIER
    )

    def __init__(self, config: BertConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:** `config`, `dtype`, `key` as
        [`boxwood.models.BertModel`][] takes them; `config.num_labels` must be 2
        (the start and the end, `transformers`' default)."""
        if config.num_labels != 2:
            raise ConfigError(
                "BertForQuestionAnswering: `num_labels` must be 2 (the logits of "
                f"an answer's start and end), got {config.num_labels}."
            )
        dtype, key = self._build_body(config, dtype, key, pooler=False)
        self.qa_outputs = classifier_layer(config, dtype, key)  # start, end

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as [`boxwood.models.BertModel`][] takes them (the
        question and the context as the two segments of `token_type_ids`).

        **Returns:** `(start_logits, end_logits)`, each `(seq,)`; with
        `output_hidden_states`, `((start_logits, end_logits), hidden_states)`,
        `hidden_states` as [`boxwood.models.BertModel`][] returns them.
        """
        hidden, _, every = self._hidden(
            input_ids, attention_mask, token_type_ids, key, output_hidden_states
        )
        logits = jax.vmap(self.qa_outputs)(hidden)
        return with_every_layer((logits[:, 0], logits[:, 1]), every)

    def loss(
        self,
        start_logits: Float[Array, "*batch seq"],
        end_logits: Float[Array, "*batch seq"],
        start_positions: Int[Array, "*batch"],
        end_positions: Int[Array, "*batch"],
    ) -> Float[Array, ""]:
        """`transformers`' span loss: the mean of the softmax cross entropies of
        the start logits against `start_positions` and of the end logits against
        `end_positions` (token indices; any leading shape, e.g. a batch from
        `jax.vmap(model)`), each averaged over the examples whose position is
        not `-100` (0 when none is).

        **Raises:** `ValueError` for a position outside `[0, seq)` other than
        `-100` (under a trace, a `boxwood.BoxwoodRuntimeError`). `transformers`
        instead clamps a position to `[0, seq]` and ignores `seq`: a negative one
        then counts as the first token, silently.
        """
        where = "BertForQuestionAnswering.loss"
        kind = ("token indices", "seq")
        start = classification_loss(
            start_logits, start_positions, _SINGLE, where, kind, "start_positions"
        )
        end = classification_loss(
            end_logits, end_positions, _SINGLE, where, kind, "end_positions"
        )
        return (start + end) / 2


_SINGLE = "single_label_classification"


class BertForMultipleChoice(BertClassifierHead):
    """BERT choosing among several candidates (SWAG): each choice (the prompt
    with one candidate) through the body, its pooled output, dropout
    (`classifier_dropout`, else `hidden_dropout_prob`) and a linear
    `classifier` to one score; the scores of the choices are the logits.
    (`num_labels` is not used: the classifier has one output, a choice's
    score.)"""

    ARCHITECTURE: ClassVar[str | None] = "BertForMultipleChoice"
    NEW_ON_LOAD: ClassVar[str | None] = any_of(CLASSIFIER, POOLER)
    OTHER_HEADS: ClassVar[str | None] = any_of(
        PREDICTIONS, NEXT_SENTENCE, QUESTION_ANSWERING
    )
    POOLED: ClassVar[bool] = True
    OUTPUTS: ClassVar[int | None] = 1

    def __call__(
        self,
        input_ids: Int[Array, "num_choices seq"],
        attention_mask: Int[Array, "num_choices seq"] | None = None,
        token_type_ids: Int[Array, "num_choices seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as [`boxwood.models.BertModel`][] takes them, with a
        leading axis of choices: `(num_choices, seq)` each.

        **Returns:** the logits of the choices, `(num_choices,)`; with
        `output_hidden_states`, `(logits, hidden_states)`, `hidden_states`
        `(num_hidden_layers + 1, num_choices, seq, hidden_size)` (each choice's
        as [`boxwood.models.BertModel`][] returns them).
        """
        if jnp.ndim(input_ids) != 2:
            raise ValueError(
                "BertForMultipleChoice: `input_ids` must have shape (num_choices, "
                f"seq), one row per choice; got shape {jnp.shape(input_ids)}. For "
                "a batch use `jax.vmap(model)`."
            )
        choices = jnp.shape(input_ids)[0]
        key = training.dropout_key(self, key, "model(input_ids, key=key)")
        # a key per choice (with rbg masks: one conversion, then a hash per row)
        keys = None if key is None else split_keys_of(stream_key(key), choices, ROW)
        every = bool(output_hidden_states)
        score = lambda i, m, t, k: self._logits(i, m, t, k, every)
        out = jax.vmap(score)(input_ids, attention_mask, token_type_ids, keys)
        if not every:
            return out[:, 0]
        return out[0][:, 0], jnp.moveaxis(out[1], 0, 1)  # layers first

    def loss(
        self, logits: Float[Array, "*batch num_choices"], labels: Int[Array, "*batch"]
    ) -> Float[Array, ""]:
        """`transformers`' loss: softmax cross entropy of the choices' logits
        (any leading shape, e.g. a batch from `jax.vmap(model)`) against the
        index of the right choice, averaged over the examples whose label is not
        `-100` (0 when none is).

        **Raises:** `ValueError` for a label outside `[0, num_choices)` other
        than `-100` (under a trace, a `boxwood.BoxwoodRuntimeError`).
        """
        kind = ("choice indices", "num_choices")
        return classification_loss(
            logits, labels, _SINGLE, "BertForMultipleChoice.loss", kind
        )
