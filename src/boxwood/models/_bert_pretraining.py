"""`BertForPreTraining`: BERT with both of its pre-training heads, the masked
language model and the next-sentence classifier, with the names,
initialisation and loss of `transformers`' class."""

from __future__ import annotations

from typing import Any, ClassVar

from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import split_keys
from .._module import Module
from ..nn import Linear
from ._bert import BertConfig
from ._bert_heads import (
    CLASSIFIER,
    NEXT_SENTENCE,
    POOLER,
    PREDICTIONS,
    QUESTION_ANSWERING,
    BertHead,
    BertLMPredictionHead,
    any_of,
    check_tied,
)
from ._blocks import with_every_layer
from ._classification import classification_loss, classifier_layer

_SINGLE = "single_label_classification"


class BertPreTrainingHeads(Module):
    """The masked-LM head (`predictions`, decoding with the word embeddings)
    and the next-sentence classifier (`seq_relationship`, two logits from the
    pooled output)."""

    predictions: BertLMPredictionHead
    seq_relationship: Linear

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        self.predictions = BertLMPredictionHead(config, dtype, key=k1)
        self.seq_relationship = classifier_layer(config, dtype, k2, outputs=2)


class BertForPreTraining(BertHead):
    """BERT with its two pre-training heads: per token, the masked-LM logits
    over the vocabulary (as [`boxwood.models.BertForMaskedLM`][]: the decoder
    is the word embedding table, so `cls.predictions.decoder.*` is not a
    parameter), and from the pooled output, the two next-sentence logits
    (`cls.seq_relationship`: whether the second segment follows the first, 0,
    or is a random one, 1). No dropout of its own. `tie_word_embeddings` must
    be true."""

    cls: BertPreTrainingHeads

    ARCHITECTURE: ClassVar[str | None] = "BertForPreTraining"
    # the decoder is the word embedding table (and the head's `bias`): a copy
    DROPPED: ClassVar[str | None] = (
        r"bert\.embeddings\.position_ids|cls\.predictions\.decoder\..*"
    )
    NEW_ON_LOAD: ClassVar[str | None] = any_of(PREDICTIONS, NEXT_SENTENCE, POOLER)
    OTHER_HEADS: ClassVar[str | None] = any_of(CLASSIFIER, QUESTION_ANSWERING)
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = BertHead.WITH_OUTPUT_BIAS

    def __init__(self, config: BertConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:** `config`, `dtype`, `key` as
        [`boxwood.models.BertModel`][] takes them (the heads' weights drawn
        from `N(0, initializer_range)`, their biases zero). The body has its
        pooler."""
        check_tied(config, "BertForPreTraining")
        dtype, key = self._build_body(config, dtype, key, pooler=True)
        self.cls = BertPreTrainingHeads(config, dtype, key=key)

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as [`boxwood.models.BertModel`][] takes them (the two
        sentences as the two segments of `token_type_ids`).

        **Returns:** `(prediction_logits, seq_relationship_logits)`: the
        masked-LM logits `(seq, vocab_size)` and the next-sentence logits
        `(2,)`; with `output_hidden_states`, `((prediction_logits,
        seq_relationship_logits), hidden_states)`, `hidden_states` as
        [`boxwood.models.BertModel`][] returns them.
        """
        hidden, _, every = self._hidden(
            input_ids, attention_mask, token_type_ids, key, output_hidden_states
        )
        table = self.bert.embeddings.word_embeddings.weight
        words = self.cls.predictions(hidden, table)
        sentence = self.cls.seq_relationship(self.bert.pooled(hidden))
        return with_every_layer((words, sentence), every)

    def loss(
        self,
        prediction_logits: Float[Array, "*batch seq vocab_size"],
        seq_relationship_logits: Float[Array, "*batch 2"],
        labels: Int[Array, "*batch seq"],
        next_sentence_label: Int[Array, "*batch"],
    ) -> Float[Array, ""]:
        """`transformers`' pre-training loss (what it computes when given both
        `labels` and `next_sentence_label`): the masked-LM loss of
        [`boxwood.models.BertForMaskedLM`][]`.loss` (token ids `labels`, `-100`
        at the tokens not masked) plus the softmax cross entropy of the
        next-sentence logits against `next_sentence_label` (0: the second
        segment follows the first, 1: it is random; `-100` leaves an example
        out), each averaged over the positions it counts (any leading shape,
        e.g. a batch from `jax.vmap(model)`).

        **Raises:** `ValueError` for a token id outside `[0, vocab_size)` or a
        next-sentence label other than 0, 1 or `-100` (under a trace, a
        `boxwood.BoxwoodRuntimeError`).
        """
        where = "BertForPreTraining.loss"
        words = classification_loss(
            prediction_logits, labels, _SINGLE, where, ("token ids", "vocab_size")
        )
        sentences = classification_loss(
            seq_relationship_logits,
            next_sentence_label,
            _SINGLE,
            where,
            ("next-sentence labels (0: follows, 1: random)", "seq_relationship"),
            "next_sentence_label",
        )
        return words + sentences
