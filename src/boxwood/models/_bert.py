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
from ..nn import Embedding, LayerNorm, Linear, MultiheadAttention, Stacked
from ._checkpoint_files import FileLayout
from ._config import ConfigError, ModelConfig, false_or_unset
from ._id_ranges import check_ids_below
from ._layers import activation, check_input_ids, supported_activation
from ._pretrained import Pretrained


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):
    """The options of a BERT `config.json` that boxwood implements (names and
    defaults as in `transformers.BertConfig`)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    model_type: ClassVar[str] = "bert"
    architecture: ClassVar[str] = "BertModel"
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"}
        | {"tie_word_embeddings", "gradient_checkpointing"}
    )
    REQUIRED: ClassVar[dict] = {
        "position_embedding_type": (
            lambda v: v in (None, "absolute"),
            "only 'absolute' position embeddings",
        ),
        "is_decoder": (false_or_unset, "only `false` (an encoder)"),
        "add_cross_attention": (false_or_unset, "only `false` (no cross-attention)"),
    }

    def validate(self, where: str) -> None:
        if not supported_activation(self.hidden_act):
            raise ConfigError(
                f"{where}the option `hidden_act` = {self.hidden_act!r} is not supported."
            )


class BertEmbeddings(Module):
    word_embeddings: Embedding
    position_embeddings: Embedding
    token_type_embeddings: Embedding
    LayerNorm: LayerNorm

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d = config.hidden_size
        self.word_embeddings = Embedding(config.vocab_size, d, dtype=dtype, key=k1)
        self.position_embeddings = Embedding(
            config.max_position_embeddings, d, dtype=dtype, key=k2
        )
        self.token_type_embeddings = Embedding(
            config.type_vocab_size, d, dtype=dtype, key=k3
        )
        self.LayerNorm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, input_ids: Array, token_type_ids: Array) -> Array:
        positions = jnp.arange(input_ids.shape[0])
        x = self.word_embeddings.weight[input_ids]
        x = x + self.token_type_embeddings.weight[token_type_ids]
        x = x + self.position_embeddings.weight[positions]
        return jax.vmap(self.LayerNorm)(x)


class BertAttention(Module):
    """Self-attention and its residual LayerNorm (`attention.self` and
    `attention.output` in the checkpoint)."""

    attn: MultiheadAttention
    LayerNorm: LayerNorm

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        d = config.hidden_size
        self.attn = MultiheadAttention(
            config.num_attention_heads, d, use_query_bias=True, use_key_bias=True,
            use_value_bias=True, use_output_bias=True, dtype=dtype, key=key,
        )  # fmt: skip
        self.LayerNorm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, x: Array, mask: Array) -> Array:
        return jax.vmap(self.LayerNorm)(x + self.attn(x, x, x, mask))


class BertLayer(Module):
    attention: BertAttention
    intermediate: Linear
    output: Linear
    output_norm: LayerNorm
    act: str = field(static=True)

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, inner = config.hidden_size, config.intermediate_size
        self.attention = BertAttention(config, dtype, key=k1)
        self.intermediate = Linear(d, inner, dtype=dtype, key=k2)
        self.output = Linear(inner, d, dtype=dtype, key=k3)
        self.output_norm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.act = config.hidden_act

    def __call__(self, x: Array, mask: Array) -> Array:
        x = self.attention(x, mask)
        h = activation(self.act, jax.vmap(self.intermediate)(x))
        return jax.vmap(self.output_norm)(x + jax.vmap(self.output)(h))


class BertEncoder(Module):
    """The layers, stored stacked (`layer[i]` is layer `i`) and applied in one
    `lax.scan`."""

    layer: Stacked

    def __init__(self, config: BertConfig, dtype: Any, *, key: PRNGKeyArray):
        self.layer = Stacked(
            lambda k: BertLayer(config, dtype, key=k), config.num_hidden_layers, key=key
        )

    def __call__(self, x: Array, mask: Array) -> Array:
        step = lambda layer, h, _: (layer(h, mask), None)
        return self.layer.scan(step, x)[0]


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
        (r"^pooler\.", "pooler.dense."),
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
    DROPPED: ClassVar[str | None] = (
        r"embeddings\.position_ids|cls\..*|classifier\..*|qa_outputs\..*"
    )

    def __init__(self, config: BertConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:**

        - `config`: a [`boxwood.models.BertConfig`][].
        - `dtype`: the parameters' dtype (default float32).
        - `key`: a `jax.random` key for the random initialisation. (Keyword only.)
        """
        k1, k2, k3 = split_keys(key, 3)
        dtype = dtype or jnp.float32
        self.embeddings = BertEmbeddings(config, dtype, key=k1)
        self.encoder = BertEncoder(config, dtype, key=k2)
        self.pooler = Linear(
            config.hidden_size, config.hidden_size, dtype=dtype, key=k3
        )
        self.config = config

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Int[Array, " seq"] | None = None,
        token_type_ids: Int[Array, " seq"] | None = None,
    ) -> Float[Array, "seq hidden_size"]:
        """**Arguments:**

        - `input_ids`: token ids, shape `(seq,)`.
        - `attention_mask`: `1` (or `True`) for real tokens, `0` for padding,
          shape `(seq,)`; default all real. Padding is never attended to.
        - `token_type_ids`: segment ids, shape `(seq,)`; default all `0`.

        **Returns:** the last hidden state, `(seq, hidden_size)`.
        """
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
        attention_mask = _ids_like("attention_mask", attention_mask, seq, 1)
        mask = attention_mask.astype(bool)  # the keys every token may attend to
        return self.encoder(self.embeddings(input_ids, token_type_ids), mask)

    def with_remat(self, remat: Any) -> Any:
        """A copy whose layers are rematerialised on the backward pass: `remat`
        is `False`/`None`, `True`/`"full"`, or a `jax.checkpoint_policies` name
        (see [`boxwood.nn.Stacked`][])."""
        return tree_at(
            lambda m: m.encoder.layer, self, self.encoder.layer.with_remat(remat)
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


def _ids_like(name: str, value: Any, seq: int, fill: int) -> Array:
    if value is None:
        return jnp.full((seq,), fill, jnp.int32)
    value = jnp.asarray(value)
    if jnp.shape(value) != (seq,):
        raise ValueError(
            f"BertModel: `{name}` must have the shape of `input_ids`, ({seq},), got "
            f"{jnp.shape(value)}."
        )
    if not (jnp.issubdtype(value.dtype, jnp.integer) or value.dtype == jnp.bool_):
        raise TypeError(
            f"BertModel: `{name}` must be an integer or boolean array, got dtype {value.dtype}."
        )
    return value
