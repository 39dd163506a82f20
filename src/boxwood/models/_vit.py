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
from ..nn import Conv2d, LayerNorm, Linear, MultiheadAttention, Stacked
from ._config import ConfigError, ModelConfig
from ._layers import activation, supported_activation
from ._pretrained import Pretrained


@dataclasses.dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """The options of a ViT `config.json` that boxwood implements (names and
    defaults as in `transformers.ViTConfig`; `labels` is `id2label` as a tuple)."""

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
    labels: tuple[str, ...] = ("LABEL_0", "LABEL_1")

    model_type: ClassVar[str] = "vit"
    architecture: ClassVar[str] = "ViTForImageClassification"
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"hidden_dropout_prob", "attention_probs_dropout_prob", "encoder_stride"}
        | {"pooler_act", "pooler_output_size"}
    )

    @classmethod
    def from_dict(cls, options: Any, source: str = "") -> ViTConfig:
        options = dict(options)
        id2label = options.pop("id2label", None)
        options.pop("label2id", None)
        if id2label is not None:
            options["labels"] = tuple(id2label[k] for k in sorted(id2label, key=int))
        return super().from_dict(options, source)

    def validate(self, where: str) -> None:
        if not supported_activation(self.hidden_act):
            raise ConfigError(
                f"{where}the option `hidden_act` = {self.hidden_act!r} is not supported."
            )
        if self.image_size % self.patch_size:
            raise ConfigError(f"{where}`image_size` must be divisible by `patch_size`.")

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        labels = out.pop("labels")
        out["id2label"] = {str(i): name for i, name in enumerate(labels)}
        out["label2id"] = {name: i for i, name in enumerate(labels)}
        return out


class ViTEmbeddings(Module):
    cls_token: Float[Array, "1 1 hidden_size"]
    position_embeddings: Float[Array, "1 patches_plus_one hidden_size"]
    patch_embeddings: Conv2d

    def __init__(self, config: ViTConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, p = config.hidden_size, config.patch_size
        patches = (config.image_size // p) ** 2
        self.cls_token = jax.random.normal(k1, (1, 1, d), dtype)
        self.position_embeddings = jax.random.normal(k2, (1, patches + 1, d), dtype)
        self.patch_embeddings = Conv2d(
            config.num_channels, d, p, stride=p, dtype=dtype, key=k3
        )

    def __call__(self, pixel_values: Array) -> Array:
        patches = self.patch_embeddings(pixel_values.astype(self.cls_token.dtype))
        patches = patches.reshape(patches.shape[0], -1).T
        x = jnp.concatenate([self.cls_token[0], patches], axis=0)
        return x + self.position_embeddings[0]


class ViTLayer(Module):
    layernorm_before: LayerNorm
    attention: MultiheadAttention
    layernorm_after: LayerNorm
    intermediate: Linear
    output: Linear
    act: str = field(static=True)

    def __init__(self, config: ViTConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2, k3 = split_keys(key, 3)
        d, b, eps = config.hidden_size, config.qkv_bias, config.layer_norm_eps
        self.layernorm_before = LayerNorm(d, eps=eps, dtype=dtype)
        self.attention = MultiheadAttention(
            config.num_attention_heads, d, use_query_bias=b, use_key_bias=b,
            use_value_bias=b, use_output_bias=True, dtype=dtype, key=k1,
        )  # fmt: skip
        self.layernorm_after = LayerNorm(d, eps=eps, dtype=dtype)
        self.intermediate = Linear(d, config.intermediate_size, dtype=dtype, key=k2)
        self.output = Linear(config.intermediate_size, d, dtype=dtype, key=k3)
        self.act = config.hidden_act

    def __call__(self, x: Array) -> Array:
        h = jax.vmap(self.layernorm_before)(x)
        x = x + self.attention(h, h, h)
        h = activation(
            self.act, jax.vmap(self.intermediate)(jax.vmap(self.layernorm_after)(x))
        )
        return x + jax.vmap(self.output)(h)


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

    def __init__(self, config: ViTConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:**

        - `config`: a [`boxwood.models.ViTConfig`][].
        - `dtype`: the parameters' dtype (default float32).
        - `key`: a `jax.random` key for the random initialisation. (Keyword only.)
        """
        k1, k2 = split_keys(key, 2)
        dtype = dtype or jnp.float32
        self.vit = ViTModel(config, dtype, key=k1)
        self.classifier = Linear(
            config.hidden_size, config.num_labels, dtype=dtype, key=k2
        )
        self.config = config

    def __call__(
        self, pixel_values: Float[Array, "3 H W"]
    ) -> Float[Array, " num_labels"]:
        """**Arguments:** `pixel_values`: one image, `(num_channels, image_size,
        image_size)`, normalised as the model's image processor does.

        **Returns:** the class logits, `(num_labels,)`.
        """
        self._check(pixel_values)
        x = self.vit.encoder.layer(self.vit.embeddings(pixel_values))
        return self.classifier(self.vit.layernorm(x[0]))

    def with_remat(self, remat: Any) -> Any:
        """A copy whose layers are rematerialised on the backward pass: `remat`
        is `False`/`None`, `True`/`"full"`, or a `jax.checkpoint_policies` name
        (see [`boxwood.nn.Stacked`][])."""
        return tree_at(
            lambda m: m.vit.encoder.layer,
            self,
            self.vit.encoder.layer.with_remat(remat),
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
