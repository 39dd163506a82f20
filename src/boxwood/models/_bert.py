"""BERT (`BertModel`): token, position and segment embeddings, post-LayerNorm
encoder layers, an optional pooler."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from .._tree import tree_at
from ..nn import Dropout, Embedding, LayerNorm, Linear, MultiheadAttention, Stacked
from . import _training as training
from ._blocks import activation, supported_activation
from ._checkpoint_files import FileLayout
from ._classification import (
    DEFAULT_LABELS,
    LABEL_OPTIONS,
    check_problem_type,
    read_labels,
    write_labels,
)
from ._id_ranges import check_ids_below
from ._inputs import check_attention_mask, check_input_ids
from ._model_config import (
    ConfigError,
    ModelConfig,
    check_initializer_range,
    check_rates,
    false_or_unset,
)
from ._pretrained import Pretrained

# how BERT and its heads are called with a dropout key (named by the error
# raised without one)
CALL = "model(input_ids, key=key)"


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):
    """The options of a BERT `config.json` that boxwood implements (names and
    defaults as in `transformers.BertConfig`; `labels` is `id2label` as a tuple,
    read by the classification heads).

    `hidden_dropout_prob` (embeddings, attention and MLP outputs),
    `attention_probs_dropout_prob` (attention weights) and `classifier_dropout`
    (the classification heads' input; `None`: `hidden_dropout_prob`) are the
    dropout rates of training; `initializer_range` the standard deviation of
    the random initialisation; `problem_type` chooses the loss of
    `BertForSequenceClassification` (see its `loss`).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None
    initializer_range: float = 0.02
    labels: tuple[str, ...] = DEFAULT_LABELS
    problem_type: str | None = None

    model_type: ClassVar[str] = "bert"
    architecture: ClassVar[str] = "BertModel"
    # `tie_word_embeddings` is read by `BertForMaskedLM` (which needs it true)
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"tie_word_embeddings", "gradient_checkpointing"}
    )
    REQUIRED: ClassVar[dict] = {
        "position_embedding_type": (
            lambda v: v in (None, "absolute"),
            "only 'absolute' position embeddings",
        ),
        "is_decoder": (false_or_unset, "only `false` (an encoder)"),
        "add_cross_attention": (false_or_unset, "only `false` (no cross-attention)"),
    }

    READ_OPTIONS: ClassVar[frozenset[str]] = LABEL_OPTIONS

    @classmethod
    def from_dict(cls, options: Any, source: str = "") -> BertConfig:
        where = f"{source}: " if source else ""
        return super().from_dict(read_labels(options, where), source)

    def validate(self, where: str) -> None:
        if not supported_activation(self.hidden_act):
            raise ConfigError(
                f"{where}the option `hidden_act` = {self.hidden_act!r} is not supported."
            )
        check_rates(self, self.DROPOUT_RATES, where, unset=("classifier_dropout",))
        check_initializer_range(self, where)
        check_problem_type(self.problem_type, self.num_labels, where)

    DROPOUT_RATES: ClassVar[tuple[str, ...]] = (
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
    )

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def classifier_rate(self) -> float:
        """The classification heads' dropout: `classifier_dropout`, else
        `hidden_dropout_prob`."""
        if self.classifier_dropout is None:
            return self.hidden_dropout_prob
        return self.classifier_dropout

    def to_dict(self) -> dict[str, Any]:
        return write_labels(super().to_dict())


class BertEmbeddings(Module):
    """The sum of the token, segment and position embeddings, normalised.

    As `torch.nn.Embedding(padding_idx=pad_token_id)` in `transformers`, the
    padding token's row starts at zero and its lookups pass no gradient to it.
    """

    word_embeddings: Embedding
    position_embeddings: Embedding
    token_type_embeddings: Embedding
    LayerNorm: LayerNorm
    dropout: Dropout
    padding_idx: int | None = field(static=True)

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, std = config.hidden_size, config.initializer_range
        table = lambda n, k, row=None: training.embedding(
            n, d, dtype, std, key=k, padding_row=row
        )
        self.padding_idx = config.pad_token_id
        self.word_embeddings = table(config.vocab_size, k1, self.padding_idx)
        self.position_embeddings = table(config.max_position_embeddings, k2)
        self.token_type_embeddings = table(config.type_vocab_size, k3)
        self.LayerNorm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(
        self, input_ids: Array, token_type_ids: Array, key: PRNGKeyArray | None
    ) -> Array:
        positions = jnp.arange(input_ids.shape[0])
        x = self.word_embeddings.weight[input_ids]
        if self.padding_idx is not None:
            padding = (input_ids == self.padding_idx)[:, None]
            x = jnp.where(padding, jax.lax.stop_gradient(x), x)
        x = x + self.token_type_embeddings.weight[token_type_ids]
        x = x + self.position_embeddings.weight[positions]
        return self.dropout(jax.vmap(self.LayerNorm)(x), key=key)


class BertAttention(Module):
    """Self-attention and its residual LayerNorm (`attention.self` and
    `attention.output` in the checkpoint)."""

    attn: MultiheadAttention
    LayerNorm: LayerNorm
    dropout: Dropout

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        d = config.hidden_size
        self.attn = MultiheadAttention(
            config.num_attention_heads, d, use_query_bias=True, use_key_bias=True,
            use_value_bias=True, use_output_bias=True,
            dropout_p=config.attention_probs_dropout_prob, dtype=dtype,
            weight_init=training.normal(config.initializer_range),
            bias_init=training.zeros, key=key,
        )  # fmt: skip
        self.LayerNorm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, x: Array, mask: Array, key: PRNGKeyArray | None) -> Array:
        k1, k2 = training.split(key, 2)
        h = self.dropout(self.attn(x, x, x, mask, key=k1), key=k2)
        return jax.vmap(self.LayerNorm)(x + h)


class BertLayer(Module):
    attention: BertAttention
    intermediate: Linear
    output: Linear
    output_norm: LayerNorm
    dropout: Dropout
    act: str = field(static=True)

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, inner = config.hidden_size, config.intermediate_size
        std = config.initializer_range
        self.attention = BertAttention(config, dtype, key=k1)
        self.intermediate = training.linear(d, inner, dtype, std, key=k2)
        self.output = training.linear(inner, d, dtype, std, key=k3)
        self.output_norm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.act = config.hidden_act

    def __call__(self, x: Array, mask: Array, key: PRNGKeyArray | None) -> Array:
        k1, k2 = training.split(key, 2)
        x = self.attention(x, mask, k1)
        h = activation(self.act, jax.vmap(self.intermediate)(x))
        h = self.dropout(jax.vmap(self.output)(h), key=k2)
        return jax.vmap(self.output_norm)(x + h)


class BertEncoder(Module):
    """The layers, stored stacked (`layer[i]` is layer `i`) and applied in one
    `lax.scan`."""

    layer: Stacked

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        self.layer = Stacked(
            lambda k: BertLayer(config, dtype, key=k), config.num_hidden_layers, key=key
        )

    def __call__(
        self, x: Array, mask: Array, key: PRNGKeyArray | None, every: bool = False
    ) -> Any:
        """The last layer's output; with `every`, `(output, hidden_states)`."""
        call = lambda layer, h, k: layer(h, mask, k)
        return training.scan_layers(self.layer, call, x, key, every)


class BertModel(Pretrained):
    """BERT's encoder: the last hidden state of one (possibly padded) sequence.

    Parameter names are those of the `transformers` checkpoint, except that the
    attention projections are a [`boxwood.nn.MultiheadAttention`][] (renamed on
    load and export: `encoder.layer.0.attention.attn.query_proj` is the file's
    `encoder.layer.0.attention.self.query`). Checkpoints of `BertFor...` heads
    (names starting `bert.`, with `LayerNorm.gamma`/`beta` in older files) load
    too; their head weights are skipped. A file without a pooler (`BertForMaskedLM`,
    `BertForTokenClassification`) loads with `pooler` `None`.
    """

    embeddings: BertEmbeddings
    encoder: BertEncoder
    pooler: Linear | None
    config: BertConfig = field(static=True)

    config_class: ClassVar[type] = BertConfig
    RENAMES: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"\.attention\.attn\.(query|key|value)_proj\.", r".attention.self.\1."),
        (r"\.attention\.attn\.output_proj\.", ".attention.output.dense."),
        (r"\.attention\.LayerNorm\.", ".attention.output.LayerNorm."),
        (r"\.intermediate\.", ".intermediate.dense."),
        (r"\.output\.(weight|bias)$", r".output.dense.\1"),
        (r"\.output_norm\.", ".output.LayerNorm."),
        (r"(^|\.)pooler\.(weight|bias)$", r"\1pooler.dense.\2"),
    )
    # `BertFor...` files prefix the body with `bert.`; older ones (as the Hub's
    # `bert-base-uncased`) name LayerNorm parameters `gamma`/`beta`.
    LAYOUTS: ClassVar[tuple[FileLayout, ...]] = (
        FileLayout(
            "`BertFor...` (`bert.` prefix, `LayerNorm.gamma`/`beta`)",
            (
                (r"^bert\.", ""),
                (r"\.LayerNorm\.gamma$", ".LayerNorm.weight"),
                (r"\.LayerNorm\.beta$", ".LayerNorm.bias"),
            ),
        ),
    )
    # `BertForMaskedLM` and `BertForTokenClassification` files have no pooler.
    OPTIONAL_PARTS: ClassVar[tuple[str, ...]] = ("pooler",)
    DROPPED: ClassVar[str | None] = r"embeddings\.position_ids"
    OTHER_HEADS: ClassVar[str | None] = r"cls\..*|classifier\..*|qa_outputs\..*"
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = (
        ("embeddings.word_embeddings.weight", "embedding"),
    )

    def __init__(
        self,
        config: BertConfig,
        dtype: Any = None,
        *,
        add_pooling_layer: bool = True,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `config`: a [`boxwood.models.BertConfig`][].
        - `dtype`: the parameters' dtype (default float32).
        - `add_pooling_layer`: whether the model has a pooler (`pooled`); the
          bodies of `BertForMaskedLM` and `BertForTokenClassification` have
          none. (Keyword only.)
        - `key`: a `jax.random` key for the random initialisation, drawn as
          `transformers` draws it: weights and embeddings from
          `N(0, initializer_range)` (the padding token's row zero), biases zero,
          LayerNorms ones and zeros. (Keyword only.)

        The model is built in training mode (dropout active: call it with
        `key=`); `from_pretrained` returns one in inference mode. Switch with
        [`boxwood.nn.inference_mode`][].
        """
        k1, k2, k3 = split_keys(key, 3)
        dtype = dtype or jnp.float32
        self.embeddings = BertEmbeddings(config, dtype, key=k1)
        self.encoder = BertEncoder(config, dtype, key=k2)
        d, std = config.hidden_size, config.initializer_range
        self.pooler = (
            training.linear(d, d, dtype, std, key=k3) if add_pooling_layer else None
        )
        self.config = config

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:**

        - `input_ids`: token ids, shape `(seq,)`.
        - `attention_mask`: `1` (or `True`) for real tokens, `0` for padding,
          shape `(seq,)`; default all real. Padding is never attended to. Any
          other value raises `ValueError` (under `jit`, a `boxwood.error_if`).
        - `token_type_ids`: segment ids, shape `(seq,)`; default all `0`.
        - `key`: a `jax.random` key for dropout, needed in training mode (a new
          one each step). (Keyword only.)
        - `output_hidden_states`: also return every layer's hidden states, as
          `transformers` returns them (keyword only; default `False`).

        **Returns:** the last hidden state, `(seq, hidden_size)`; with
        `output_hidden_states`, `(last_hidden_state, hidden_states)`, where
        `hidden_states` is `(num_hidden_layers + 1, seq, hidden_size)`: the
        embeddings' output, then each layer's (`transformers`' `hidden_states[i]`
        is `hidden_states[i]`; the last is the last hidden state).
        """
        key = training.dropout_key(self, key, CALL)
        c = self.config
        input_ids = check_input_ids(
            "BertModel", input_ids, c.max_position_embeddings, c.vocab_size
        )
        seq = input_ids.shape[0]
        token_type_ids = check_ids_below(
            "BertModel", "token_type_ids",
            _ids_like("token_type_ids", token_type_ids, seq, 0),
            c.type_vocab_size, "type_vocab_size",
        )  # fmt: skip
        attention_mask = _checked_mask(attention_mask, seq)
        mask = attention_mask.astype(bool)  # the keys every token may attend to
        k1, k2 = training.split(key, 2)
        x = self.embeddings(input_ids, token_type_ids, k1)
        return self.encoder(x, mask, k2, bool(output_hidden_states))

    def with_remat(self, remat: Any) -> Any:
        """A copy whose layers are rematerialised on the backward pass: `remat`
        is `False`/`None`, `True`/`"full"`, or a `jax.checkpoint_policies` name
        (see [`boxwood.nn.Stacked`][])."""
        return tree_at(
            lambda m: m.encoder.layer, self, self.encoder.layer.with_remat(remat)
        )

    def with_unroll(self, unroll: int | bool) -> Any:
        """A copy whose layers are looped over as `unroll` says: `1` (a scan, one
        layer at a time), an int `n` (`n` per iteration) or `True` (no scan; see
        [`boxwood.nn.Stacked`][])."""
        return tree_at(
            lambda m: m.encoder.layer, self, self.encoder.layer.with_unroll(unroll)
        )

    def pooled(
        self, hidden: Float[Array, "seq hidden_size"]
    ) -> Float[Array, " hidden_size"]:
        """BERT's pooled output: `tanh(pooler(hidden[0]))` of the last hidden state.

        **Raises:** `ValueError` if the model was loaded from a checkpoint without a
        pooler (`BertForMaskedLM` and `BertForTokenClassification` files have none).
        """
        if self.pooler is None:
            raise ValueError(
                "BertModel.pooled: this model's checkpoint had no pooler "
                "(`pooler.dense.*`; `BertForMaskedLM` and `BertForTokenClassification` "
                "files have none), so it has no pooled output. Use the last hidden "
                "state (`model(input_ids)`), or a checkpoint with a pooler."
            )
        return jnp.tanh(self.pooler(hidden[0]))


def _checked_mask(mask: Any, seq: int) -> Array:
    """`attention_mask` of `seq` entries, each 0 or 1 (integers, booleans, or
    floats as the causal LMs and `transformers` take them)."""
    mask = _ids_like("attention_mask", mask, seq, 1)
    if mask.dtype == jnp.bool_:
        return mask
    if jnp.issubdtype(mask.dtype, jnp.floating):
        return check_attention_mask("BertModel", mask, (seq,))
    return check_ids_below(
        "BertModel", "attention_mask", mask, 2, "", rule="BertModel: "
        "`attention_mask` must hold only 1 (a token to attend to) and 0 (padding)",
    )  # fmt: skip


def _ids_like(name: str, value: Any, seq: int, fill: int) -> Array:
    if value is None:
        return jnp.full((seq,), fill, jnp.int32)
    value = jnp.asarray(value)
    if jnp.shape(value) != (seq,):
        raise ValueError(
            f"BertModel: `{name}` must have the shape of `input_ids`, ({seq},), got "
            f"{jnp.shape(value)}."
        )
    floats = name == "attention_mask" and jnp.issubdtype(value.dtype, jnp.floating)
    if not (jnp.issubdtype(value.dtype, jnp.integer) or value.dtype == jnp.bool_):
        if not floats:
            raise TypeError(
                f"BertModel: `{name}` must be an integer or boolean array, got "
                f"dtype {value.dtype}."
            )
    return value
