"""ViT (`ViTForImageClassification`): patch embedding, a class token, pre-LayerNorm
encoder layers, a linear classifier on the class token."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from .._tree import tree_at
from ..nn import Conv2d, Dropout, LayerNorm, Linear, MultiheadAttention, Stacked
from . import _training as training
from ._blocks import activation, supported_activation, with_every_layer
from ._classification import (
    DEFAULT_LABELS,
    LABEL_OPTIONS,
    check_problem_type,
    classification_loss,
    classifier_layer,
    read_labels,
    write_labels,
)
from ._model_config import (
    ConfigError,
    ModelConfig,
    check_initializer_range,
    check_rates,
)
from ._pretrained import Pretrained


@dataclasses.dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """The options of a ViT `config.json` that boxwood implements (names and
    defaults as in `transformers.ViTConfig`; `labels` is `id2label` as a tuple).

    `hidden_dropout_prob` (embeddings, attention and MLP outputs) and
    `attention_probs_dropout_prob` (attention weights) are the dropout rates of
    training, `initializer_range` the scale of the random initialisation,
    `problem_type` the choice of loss (see `ViTForImageClassification.loss`).
    """

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    qkv_bias: bool = True
    labels: tuple[str, ...] = DEFAULT_LABELS
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    initializer_range: float = 0.02
    problem_type: str | None = None

    model_type: ClassVar[str] = "vit"
    architecture: ClassVar[str] = "ViTForImageClassification"
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"encoder_stride", "pooler_act", "pooler_output_size"}
    )

    READ_OPTIONS: ClassVar[frozenset[str]] = LABEL_OPTIONS

    @classmethod
    def from_dict(cls, options: Any, source: str = "") -> ViTConfig:
        where = f"{source}: " if source else ""
        return super().from_dict(read_labels(options, where), source)

    def validate(self, where: str) -> None:
        if not supported_activation(self.hidden_act):
            raise ConfigError(
                f"{where}the option `hidden_act` = {self.hidden_act!r} is not supported."
            )
        if self.image_size % self.patch_size:
            raise ConfigError(f"{where}`image_size` must be divisible by `patch_size`.")
        rates = ("hidden_dropout_prob", "attention_probs_dropout_prob")
        check_rates(self, rates, where)
        check_initializer_range(self, where)
        check_problem_type(self.problem_type, self.num_labels, where)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return write_labels(super().to_dict())


class ViTEmbeddings(Module):
    """The patches projected, the class token before them, the position
    embeddings added. Initialised as `transformers` does: the class token and
    position embeddings from `N(0, initializer_range)` cut off at -2 and 2, the
    projection's weight from `N(0, initializer_range)`, its bias zero."""

    cls_token: Float[Array, "1 1 hidden_size"]
    position_embeddings: Float[Array, "1 patches_plus_one hidden_size"]
    patch_embeddings: Conv2d
    dropout: Dropout

    def __init__(self, config: ViTConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, p, r = config.hidden_size, config.patch_size, config.initializer_range
        patches = (config.image_size // p) ** 2
        self.cls_token = training.draw(training.truncated(r), k1, (1, 1, d), dtype)
        self.position_embeddings = training.draw(
            training.truncated(r), k2, (1, patches + 1, d), dtype
        )
        self.patch_embeddings = Conv2d(
            config.num_channels, d, p, stride=p, dtype=dtype,
            weight_init=training.normal(r), bias_init=training.zeros, key=k3,
        )  # fmt: skip
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, pixel_values: Array, key: PRNGKeyArray | None) -> Array:
        patches = self.patch_embeddings(pixel_values.astype(self.cls_token.dtype))
        patches = patches.reshape(patches.shape[0], -1).T
        x = jnp.concatenate([self.cls_token[0], patches], axis=0)
        return self.dropout(x + self.position_embeddings[0], key=key)


class ViTLayer(Module):
    layernorm_before: LayerNorm
    attention: MultiheadAttention
    layernorm_after: LayerNorm
    intermediate: Linear
    output: Linear
    dropout: Dropout
    act: str = field(static=True)

    def __init__(self, config: ViTConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, b, eps = config.hidden_size, config.qkv_bias, config.layer_norm_eps
        std, inner = config.initializer_range, config.intermediate_size
        self.layernorm_before = LayerNorm(d, eps=eps, dtype=dtype)
        self.attention = MultiheadAttention(
            config.num_attention_heads, d, use_query_bias=b, use_key_bias=b,
            use_value_bias=b, use_output_bias=True,
            dropout_p=config.attention_probs_dropout_prob, dtype=dtype,
            weight_init=training.normal(std), bias_init=training.zeros, key=k1,
        )  # fmt: skip
        self.layernorm_after = LayerNorm(d, eps=eps, dtype=dtype)
        self.intermediate = training.linear(d, inner, dtype, std, key=k2)
        self.output = training.linear(inner, d, dtype, std, key=k3)
        self.dropout = Dropout(config.hidden_dropout_prob)  # both outputs'
        self.act = config.hidden_act

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        k1, k2, k3 = training.split(key, 3)
        h = jax.vmap(self.layernorm_before)(x)
        x = x + self.dropout(self.attention(h, h, h, key=k1), key=k2)
        h = activation(
            self.act, jax.vmap(self.intermediate)(jax.vmap(self.layernorm_after)(x))
        )
        return x + self.dropout(jax.vmap(self.output)(h), key=k3)


class ViTEncoder(Module):
    """The layers, stored stacked (`layer[i]` is layer `i`) and applied in one
    `lax.scan`."""

    layer: Stacked

    def __init__(self, config: ViTConfig, dtype: Any, *, key: PRNGKeyArray):
        self.layer = Stacked(
            lambda k: ViTLayer(config, dtype, key=k), config.num_hidden_layers, key=key
        )


class ViTModel(Module):
    embeddings: ViTEmbeddings
    encoder: ViTEncoder
    layernorm: LayerNorm

    def __init__(self, config: ViTConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        self.embeddings = ViTEmbeddings(config, dtype, key=k1)
        self.encoder = ViTEncoder(config, dtype, key=k2)
        self.layernorm = LayerNorm(
            config.hidden_size, eps=config.layer_norm_eps, dtype=dtype
        )


class ViTForImageClassification(Pretrained):
    """A Vision Transformer classifying one image from its class token.

    Parameter names are those of the `transformers` checkpoint, except that each
    layer's attention is a [`boxwood.nn.MultiheadAttention`][]
    (`vit.encoder.layer.0.attention.query_proj` is the file's
    `vit.encoder.layer.0.attention.attention.query`, `output_proj` its
    `attention.output.dense`) and the patch projection is a
    [`boxwood.nn.Conv2d`][] (`vit.embeddings.patch_embeddings`).
    """

    vit: ViTModel
    classifier: Linear
    config: ViTConfig = field(static=True)

    config_class: ClassVar[type] = ViTConfig
    RENAMES: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"\.attention\.(query|key|value)_proj\.", r".attention.attention.\1."),
        (r"\.attention\.output_proj\.", ".attention.output.dense."),
        (r"\.intermediate\.", ".intermediate.dense."),
        (r"\.output\.(weight|bias)$", r".output.dense.\1"),
        (r"\.patch_embeddings\.", ".patch_embeddings.projection."),
    )
    # the head: drawn anew where a file lacks it or holds it for other labels
    # (`from_pretrained(..., num_labels=, ignore_mismatched_sizes=True)`)
    NEW_ON_LOAD: ClassVar[str | None] = r"classifier\..*"

    def __init__(self, config: ViTConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:**

        - `config`: a [`boxwood.models.ViTConfig`][].
        - `dtype`: the parameters' dtype (default float32).
        - `key`: a `jax.random` key for the random initialisation, drawn as
          `transformers` draws it (see `ViTEmbeddings`; linear weights from
          `N(0, initializer_range)`, biases zero, LayerNorms ones and zeros).
          (Keyword only.)

        The model is built in training mode (with a dropout rate set, call it
        with `key=`); `from_pretrained` returns one in inference mode. Switch
        with [`boxwood.nn.inference_mode`][].
        """
        k1, k2 = split_keys(key, 2)
        dtype = dtype or jnp.float32
        self.vit = ViTModel(config, dtype, key=k1)
        self.classifier = classifier_layer(config, dtype, k2)
        self.config = config

    def __call__(
        self,
        pixel_values: Float[Array, "3 H W"],
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:**

        - `pixel_values`: one image, `(num_channels, image_size, image_size)`,
          normalised as the model's image processor does.
        - `key`: a `jax.random` key for dropout, needed in training mode when a
          dropout rate is set (a new one each step). (Keyword only.)
        - `output_hidden_states`: also return every layer's hidden states, as
          `transformers` returns them (keyword only; default `False`).

        **Returns:** the class logits, `(num_labels,)`; with
        `output_hidden_states`, `(logits, hidden_states)`, `hidden_states`
        `(num_hidden_layers + 1, num_patches + 1, hidden_size)`: the embeddings'
        output, then each layer's (the last before the final `layernorm`, as
        `transformers`' `hidden_states`).
        """
        self._check(pixel_values)
        key = training.dropout_key(self, key, "model(pixel_values, key=key)")
        k1, k2 = training.split(key, 2)
        x = self.vit.embeddings(pixel_values, k1)
        call = lambda layer, h, k: layer(h, key=k)
        every = bool(output_hidden_states)
        out = training.scan_layers(self.vit.encoder.layer, call, x, k2, every)
        x, layers = out if every else (out, None)
        return with_every_layer(self.classifier(self.vit.layernorm(x[0])), layers)

    def loss(
        self, logits: Float[Array, "*batch num_labels"], labels: Array
    ) -> Float[Array, ""]:
        """The loss `transformers` computes for these logits (any leading shape,
        e.g. a batch from `jax.vmap(model)`), averaged over them, chosen by
        `problem_type` as [`boxwood.models.BertForSequenceClassification`][]`.loss`
        chooses it (unset: regression for one label, single-label
        classification for integer `labels`, multi-label for float ones), with
        its checks of the class ids and its value (0) when every id is `-100`."""
        return classification_loss(
            logits, labels, self.config.problem_type, "ViTForImageClassification.loss"
        )

    def with_remat(self, remat: Any) -> Any:
        """A copy whose layers are rematerialised on the backward pass: `remat`
        is `False`/`None`, `True`/`"full"`, or a `jax.checkpoint_policies` name
        (see [`boxwood.nn.Stacked`][])."""
        return tree_at(
            lambda m: m.vit.encoder.layer,
            self,
            self.vit.encoder.layer.with_remat(remat),
        )

    def with_unroll(self, unroll: int | bool) -> Any:
        """A copy whose layers are looped over as `unroll` says: `1` (a scan, one
        layer at a time), an int `n` (`n` per iteration) or `True` (no scan; see
        [`boxwood.nn.Stacked`][])."""
        return tree_at(
            lambda m: m.vit.encoder.layer,
            self,
            self.vit.encoder.layer.with_unroll(unroll),
        )

    def _check(self, pixel_values: Any) -> None:
        c = self.config
        want = (c.num_channels, c.image_size, c.image_size)
        if jnp.shape(pixel_values) != want:
            raise ValueError(
                f"ViTForImageClassification: `pixel_values` must have shape {want} "
                f"(one image, channels first), got {jnp.shape(pixel_values)}. For a "
                "batch use `jax.vmap(model)(pixel_values)`."
            )
        if not jnp.issubdtype(jnp.result_type(pixel_values), jnp.floating):
            raise TypeError(
                "ViTForImageClassification: `pixel_values` must be a floating-point "
                f"array, got dtype {jnp.result_type(pixel_values)}."
            )

    def export_array(self, name: str, array: np.ndarray) -> np.ndarray:
        if name.endswith("patch_embeddings.bias"):
            return array.reshape(-1)  # boxwood's Conv2d bias is (out, 1, 1)
        return super().export_array(name, array)
