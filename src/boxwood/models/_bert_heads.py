"""BERT's task heads over `BertModel`: `BertForMaskedLM`,
`BertForSequenceClassification` and `BertForTokenClassification`, with the
names, initialisation, dropout and losses of `transformers`' classes."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import split_keys, zeros
from .._module import Module, field
from .._tree import tree_at
from ..nn import Dropout, LayerNorm, Linear
from . import _training as training
from ._bert import CALL, BertConfig, BertModel
from ._blocks import activation, with_every_layer
from ._checkpoint_files import FileLayout
from ._classification import classification_loss, classifier_layer
from ._model_config import ConfigError
from ._pretrained import Pretrained

# The `BertModel` renames hold under the heads' `bert.` prefix too.
_NORMS = (
    (r"\.LayerNorm\.gamma$", ".LayerNorm.weight"),
    (r"\.LayerNorm\.beta$", ".LayerNorm.bias"),
)
_OLD_NORMS = FileLayout("older files (`LayerNorm.gamma`/`beta`)", _NORMS)
# a `BertModel` file: the body alone, without the `bert.` prefix
_BODY = FileLayout(
    "`BertModel` (the body, without `bert.`)",
    ((r"^(embeddings|encoder|pooler)\.", r"bert.\1."), *_NORMS),
)

# The parts of BERT's heads, as `save_pretrained` names them: each head class
# draws its own anew where a file lacks them (`NEW_ON_LOAD`) and drops the
# others' (`OTHER_HEADS`).
POOLER = r"bert\.pooler\..*"
PREDICTIONS = r"cls\.predictions\..*"  # the masked-LM head
NEXT_SENTENCE = r"cls\.seq_relationship\..*"  # `BertForPreTraining`'s other head
CLASSIFIER = r"classifier\..*"
QUESTION_ANSWERING = r"qa_outputs\..*"


def any_of(*patterns: str) -> str:
    return "|".join(patterns)


class BertHead(Pretrained):
    """What the heads share: the `bert` body (a [`boxwood.models.BertModel`][],
    with or without its pooler), loading and export under the file's names, the
    inference mode of a loaded model, `with_remat`, `with_unroll`."""

    bert: BertModel
    config: BertConfig = field(static=True)

    config_class: ClassVar[type] = BertConfig
    RENAMES: ClassVar[tuple[tuple[str, str], ...]] = BertModel.RENAMES
    LAYOUTS: ClassVar[tuple[FileLayout, ...]] = (_OLD_NORMS, _BODY)
    DROPPED: ClassVar[str | None] = r"bert\.embeddings\.position_ids"
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = (
        ("bert.embeddings.word_embeddings.weight", "embedding"),
    )
    # the masked-LM heads' output bias, beside the table they decode with
    WITH_OUTPUT_BIAS: ClassVar[tuple[tuple[str, str], ...]] = (
        *VOCABULARY,
        ("cls.predictions.bias", "zeros"),
    )

    def with_remat(self, remat: Any) -> Any:
        """A copy whose layers are rematerialised on the backward pass (see
        [`boxwood.models.BertModel`][]`.with_remat`)."""
        return tree_at(lambda m: m.bert, self, self.bert.with_remat(remat))

    def with_unroll(self, unroll: int | bool) -> Any:
        """A copy whose layers are looped over as `unroll` says (see
        [`boxwood.models.BertModel`][]`.with_unroll`)."""
        return tree_at(lambda m: m.bert, self, self.bert.with_unroll(unroll))

    def _build_body(
        self, config: BertConfig, dtype: Any, key: PRNGKeyArray, pooler: bool
    ) -> tuple[Any, PRNGKeyArray]:
        """Sets `bert` (with a pooler where `pooler`) and `config` in a head's
        `__init__`; returns the parameters' dtype and the key left for the
        head's own layers."""
        k1, k2 = split_keys(key, 2)
        dtype = dtype or jnp.float32
        self.bert = BertModel(config, dtype, add_pooling_layer=pooler, key=k1)
        self.config = config
        return dtype, k2

    def _hidden(
        self,
        input_ids: Any,
        attention_mask: Any,
        token_type_ids: Any,
        key: Any,
        every: bool = False,
    ) -> tuple[Array, Any, Array | None]:
        """The body's last hidden state, the key left for the head and, where
        `every`, every layer's hidden states (else `None`)."""
        k1, k2 = training.split(training.dropout_key(self, key, CALL), 2)
        out = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            key=k1,
            output_hidden_states=every,
        )
        hidden, layers = out if every else (out, None)
        return hidden, k2, layers


def check_tied(config: BertConfig, name: str) -> None:
    """A masked-LM head decodes with the word embeddings: `ConfigError` where
    the config unties them."""
    if not config.extra.get("tie_word_embeddings", True):
        raise ConfigError(
            f"{name}: `tie_word_embeddings` = false (a decoder apart from the word "
            "embeddings) is not supported; boxwood's masked-LM head decodes with "
            "the word embedding table."
        )


class BertPredictionHeadTransform(Module):
    dense: Linear
    LayerNorm: LayerNorm
    act: str = field(static=True)

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        d = config.hidden_size
        self.dense = training.linear(d, d, dtype, config.initializer_range, key=key)
        self.LayerNorm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.act = config.hidden_act

    def __call__(self, x: Array) -> Array:
        return jax.vmap(self.LayerNorm)(activation(self.act, jax.vmap(self.dense)(x)))


class BertLMPredictionHead(Module):
    """The transform and the output bias; the decoder's weight is the word
    embedding table (tied, as `transformers` ties it)."""

    transform: BertPredictionHeadTransform
    bias: Float[Array, " vocab_size"]

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        self.transform = BertPredictionHeadTransform(config, dtype, key=key)
        self.bias = zeros((config.vocab_size,), dtype)

    def __call__(self, hidden: Array, table: Array) -> Array:
        """The logits over the vocabulary, decoded with `table`."""
        return self.transform(hidden) @ table.T + self.bias[None, :]


class BertOnlyMLMHead(Module):
    predictions: BertLMPredictionHead

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        self.predictions = BertLMPredictionHead(config, dtype, key=key)


class BertForMaskedLM(BertHead):
    """BERT with its masked-language-modelling head: per token, the logits over
    the vocabulary, `transform(hidden) @ word_embeddings.T + bias` (`transform`:
    dense, activation, LayerNorm). The decoder's weight is the body's word
    embedding table, so `cls.predictions.decoder.*` is not a parameter (files
    that store it load; it is skipped). `tie_word_embeddings` must be true.
    """

    cls: BertOnlyMLMHead

    ARCHITECTURE: ClassVar[str | None] = "BertForMaskedLM"
    # the decoder is the word embedding table (and the head's `bias`): a copy
    DROPPED: ClassVar[str | None] = (
        r"bert\.embeddings\.position_ids|cls\.predictions\.decoder\..*"
    )
    NEW_ON_LOAD: ClassVar[str | None] = PREDICTIONS
    OTHER_HEADS: ClassVar[str | None] = any_of(
        POOLER, NEXT_SENTENCE, CLASSIFIER, QUESTION_ANSWERING
    )
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = BertHead.WITH_OUTPUT_BIAS

    def __init__(self, config: BertConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:** `config`, `dtype`, `key` as
        [`boxwood.models.BertModel`][] takes them (the head's weights drawn
        from `N(0, initializer_range)`, its biases zero). The body has no
        pooler."""
        check_tied(config, "BertForMaskedLM")
        dtype, key = self._build_body(config, dtype, key, pooler=False)
        self.cls = BertOnlyMLMHead(config, dtype, key=key)

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as [`boxwood.models.BertModel`][] takes them.

        **Returns:** the logits over the vocabulary, `(seq, vocab_size)`; with
        `output_hidden_states`, `(logits, hidden_states)`, `hidden_states` as
        [`boxwood.models.BertModel`][] returns them.
        """
        hidden, _, every = self._hidden(
            input_ids, attention_mask, token_type_ids, key, output_hidden_states
        )
        return with_every_layer(self.cls.predictions(hidden, self._table()), every)

    def _table(self) -> Array:
        """The decoder's weight: the word embedding table."""
        return self.bert.embeddings.word_embeddings.weight

    def loss(
        self, logits: Float[Array, "*batch vocab_size"], labels: Int[Array, "*batch"]
    ) -> Float[Array, ""]:
        """The masked-LM loss of `transformers`: softmax cross entropy of
        `logits` (any leading shape, e.g. a batch from `jax.vmap(model)`)
        against token ids `labels`, averaged over the positions whose label is
        not `-100` (the unmasked tokens); 0 when every label is `-100`.

        **Raises:** `ValueError` for a label outside `[0, vocab_size)` other than
        `-100` (a `boxwood.BoxwoodRuntimeError` when computed under a trace; see
        [`boxwood.models.BertForSequenceClassification`][]`.loss`)."""
        return classification_loss(
            logits,
            labels,
            "single_label_classification",
            "BertForMaskedLM.loss",
            ("token ids", "vocab_size"),
        )


class BertClassifierHead(BertHead):
    """What the classification heads share: dropout (`classifier_dropout`, else
    `hidden_dropout_prob`) and a linear `classifier` to `num_labels` outputs
    (`len(config.labels)`, or `OUTPUTS`), over the pooled output (`POOLED`) or
    each token's last hidden state."""

    dropout: Dropout
    classifier: Linear

    # whether the classifier reads the pooled output (the body keeps its pooler)
    POOLED: ClassVar[bool]
    # the classifier's outputs where not `num_labels` (a choice's one score)
    OUTPUTS: ClassVar[int | None] = None

    def __init__(self, config: BertConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:** `config`, `dtype`, `key` as
        [`boxwood.models.BertModel`][] takes them; `config.labels` (`id2label`)
        gives the number of outputs."""
        dtype, key = self._build_body(config, dtype, key, pooler=self.POOLED)
        self.dropout = Dropout(config.classifier_rate)
        self.classifier = classifier_layer(config, dtype, key, self.OUTPUTS)

    def _logits(
        self,
        input_ids: Any,
        attention_mask: Any,
        token_type_ids: Any,
        key: Any,
        every: bool = False,
    ) -> Any:
        """The classifier's outputs: `(num_labels,)` pooled, else per token;
        with `every`, and every layer's hidden states."""
        hidden, key, layers = self._hidden(
            input_ids, attention_mask, token_type_ids, key, every
        )
        if self.POOLED:
            out = self.classifier(self.dropout(self.bert.pooled(hidden), key=key))
        else:
            out = jax.vmap(self.classifier)(self.dropout(hidden, key=key))
        return with_every_layer(out, layers)


class BertForSequenceClassification(BertClassifierHead):
    """BERT classifying (or scoring) a whole sequence: the pooled output, dropout
    (`classifier_dropout`, else `hidden_dropout_prob`), a linear classifier to
    `num_labels` logits (`len(config.labels)`)."""

    ARCHITECTURE: ClassVar[str | None] = "BertForSequenceClassification"
    NEW_ON_LOAD: ClassVar[str | None] = any_of(CLASSIFIER, POOLER)
    OTHER_HEADS: ClassVar[str | None] = any_of(
        PREDICTIONS, NEXT_SENTENCE, QUESTION_ANSWERING
    )
    POOLED: ClassVar[bool] = True

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as [`boxwood.models.BertModel`][] takes them.

        **Returns:** the logits (or regression outputs), `(num_labels,)`; with
        `output_hidden_states`, `(logits, hidden_states)`, `hidden_states` as
        [`boxwood.models.BertModel`][] returns them.
        """
        return self._logits(
            input_ids, attention_mask, token_type_ids, key, output_hidden_states
        )

    def loss(
        self, logits: Float[Array, "*batch num_labels"], labels: Array
    ) -> Float[Array, ""]:
        """The loss `transformers` computes for these logits (any leading shape,
        e.g. a batch from `jax.vmap(model)`), averaged over them. The config's
        `problem_type` chooses it; unset, it is chosen as `transformers` does:

        - one label (`num_labels == 1`): `"regression"`, the mean squared error
          against float `labels` of shape `logits.shape[:-1]` (or `logits.shape`);
        - integer `labels` (class ids, shape `logits.shape[:-1]`):
          `"single_label_classification"`, softmax cross entropy (ids `-100`
          left out; 0 when every id is `-100`, as in every loss of
          `boxwood.models`, where PyTorch gives NaN);
        - float `labels` of the shape of `logits` (targets in `[0, 1]`):
          `"multi_label_classification"`, sigmoid binary cross entropy.

        **Raises:** `ValueError` for a class id outside `[0, num_labels)` other
        than `-100` (PyTorch's "Target -1 is out of bounds"; a GLUE test split
        labels its rows -1): at once when `labels` is a concrete array, else (under
        a trace) a `boxwood.BoxwoodRuntimeError` when the computation runs. Under
        `boxwood.filter_jit` that error carries the message alone; under a plain
        `jax.jit`, XLA reports it as its own runtime error, whose text ends with
        `BoxwoodRuntimeError: <the message>`.
        """
        return classification_loss(
            logits,
            labels,
            self.config.problem_type,
            "BertForSequenceClassification.loss",
        )


class BertForTokenClassification(BertClassifierHead):
    """BERT labelling each token: the last hidden state, dropout
    (`classifier_dropout`, else `hidden_dropout_prob`), a linear classifier to
    `num_labels` logits per token. The body has no pooler."""

    ARCHITECTURE: ClassVar[str | None] = "BertForTokenClassification"
    NEW_ON_LOAD: ClassVar[str | None] = CLASSIFIER
    OTHER_HEADS: ClassVar[str | None] = any_of(
        POOLER, PREDICTIONS, NEXT_SENTENCE, QUESTION_ANSWERING
    )
    POOLED: ClassVar[bool] = False

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:** as [`boxwood.models.BertModel`][] takes them.

        **Returns:** the logits of each token, `(seq, num_labels)`; with
        `output_hidden_states`, `(logits, hidden_states)`, `hidden_states` as
        [`boxwood.models.BertModel`][] returns them.
        """
        return self._logits(
            input_ids, attention_mask, token_type_ids, key, output_hidden_states
        )

    def loss(
        self, logits: Float[Array, "*batch num_labels"], labels: Int[Array, "*batch"]
    ) -> Float[Array, ""]:
        """`transformers`' token-classification loss: softmax cross entropy of
        `logits` (any leading shape, e.g. `(batch, seq, num_labels)` from
        `jax.vmap(model)`) against class ids `labels`, averaged over the tokens
        whose label is not `-100` (padding, continued words); 0 when every label
        is `-100`.

        **Raises:** `ValueError` for a class id outside `[0, num_labels)` other
        than `-100` (see [`boxwood.models.BertForSequenceClassification`][]`.loss`).
        """
        return classification_loss(
            logits,
            labels,
            "single_label_classification",
            "BertForTokenClassification.loss",
        )
