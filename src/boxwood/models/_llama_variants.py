"""Llama's variants: Mistral (a sliding window), Qwen2 (q/k/v biases, sliding
layers) and Gemma (scaled embeddings, `(1 + weight)` RMSNorm), each a config
subclass of `LlamaConfig` setting its hooks and a model subclass of
`LlamaForCausalLM`."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ._llama import LlamaConfig, LlamaForCausalLM
from ._model_config import ConfigError, false_or_unset


def dense_only(value: Any) -> bool:
    """A `REQUIRED` check: no mixture of experts (`num_experts` unset or 1)."""
    return value in (None, 1)


def _positive_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and value > 0)


def _check_window(window: Any, where: str) -> None:
    if not _positive_or_none(window):
        raise ConfigError(
            f"{where}`sliding_window` must be a positive int or null, got {window!r}."
        )


@dataclasses.dataclass(frozen=True)
class MistralConfig(LlamaConfig):
    """The options of a Mistral `config.json` (as `transformers.MistralConfig`):
    Llama's, with a `sliding_window` applied to every layer (`null`: full
    attention) and no biases."""

    intermediate_size: int = 14336
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    sliding_window: int | None = 4096

    model_type: ClassVar[str] = "mistral"
    architecture: ClassVar[str] = "MistralForCausalLM"
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[dict] = {
        "attention_bias": (false_or_unset, "only `false` (Mistral has no biases)"),
        "mlp_bias": (false_or_unset, "only `false` (Mistral has no biases)"),
        "num_experts": (dense_only, "only dense models"),
    }

    def validate(self, where: str) -> None:
        super().validate(where)
        _check_window(self.sliding_window, where)

    def layer_windows(self) -> tuple[int | None, ...]:
        return (self.sliding_window,) * self.num_hidden_layers


_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """The options of a Qwen2 `config.json` (as `transformers.Qwen2Config`):
    Llama's, with biases on the query, key and value projections (none on the
    output projection) and optional sliding-window layers: with
    `use_sliding_window`, the layers marked `"sliding_attention"` in `layer_types`
    (by default those from `max_window_layers` on) attend over the last
    `sliding_window` positions."""

    vocab_size: int = 151936
    intermediate_size: int = 22016
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    layer_types: tuple[str, ...] | None = None

    model_type: ClassVar[str] = "qwen2"
    architecture: ClassVar[str] = "Qwen2ForCausalLM"
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[dict] = {
        "attention_bias": (false_or_unset, "only `false` (not a Qwen2 option)"),
        "mlp_bias": (false_or_unset, "only `false` (not a Qwen2 option)"),
        "use_mrope": (false_or_unset, "only `false` (text-only Qwen2)"),
        "num_experts": (dense_only, "only dense models"),
    }

    def validate(self, where: str) -> None:
        super().validate(where)
        _check_window(self.sliding_window, where)
        types = self.layer_types
        if types is not None and (
            len(types) != self.num_hidden_layers
            or any(t not in _LAYER_TYPES for t in types)
        ):
            raise ConfigError(
                f"{where}`layer_types` must list {self.num_hidden_layers} entries "
                f"(`num_hidden_layers`), each one of {', '.join(_LAYER_TYPES)}; got "
                f"{list(types)!r}."
            )

    @property
    def projection_biases(self) -> tuple[bool, bool]:
        return True, False

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        # not options of `transformers.Qwen2Config` (a null `head_dim` breaks it)
        del out["attention_bias"], out["mlp_bias"]
        if out["head_dim"] is None:
            del out["head_dim"]
        return out

    def layer_windows(self) -> tuple[int | None, ...]:
        window = self.sliding_window if self.use_sliding_window else None
        types = self.layer_types or tuple(
            "sliding_attention" if i >= self.max_window_layers else "full_attention"
            for i in range(self.num_hidden_layers)
        )
        return tuple(window if t == "sliding_attention" else None for t in types)


def _tanh_gelu_or_unset(value: Any) -> bool:
    # `transformers` 5 builds Gemma's MLP from `hidden_act` alone; these values
    # name the tanh GELU in every version (older ones read "gelu" as it too)
    return value in (None, "gelu", "gelu_pytorch_tanh")


@dataclasses.dataclass(frozen=True)
class GemmaConfig(LlamaConfig):
    """The options of a Gemma `config.json` (as `transformers.GemmaConfig`):
    Llama's, with token embeddings scaled by `sqrt(hidden_size)`, RMSNorms that
    multiply by `1 + weight`, the tanh GELU (`hidden_act` "gelu" is read as
    "gelu_pytorch_tanh", as `transformers` does) and tied embeddings by default."""

    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16
    head_dim: int | None = 256
    hidden_act: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True

    model_type: ClassVar[str] = "gemma"
    architecture: ClassVar[str] = "GemmaForCausalLM"
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[dict] = {
        "mlp_bias": (false_or_unset, "only `false` (not a Gemma option)"),
        "use_bidirectional_attention": (false_or_unset, "only causal attention"),
        "hidden_activation": (
            _tanh_gelu_or_unset,
            "only `null`, 'gelu' or 'gelu_pytorch_tanh', each the tanh GELU as "
            "`transformers` builds it (`hidden_act` chooses the activation)",
        ),
        "num_experts": (dense_only, "only dense models"),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_act == "gelu":
            object.__setattr__(self, "hidden_act", "gelu_pytorch_tanh")

    @property
    def embedding_scale(self) -> float | None:
        return self.hidden_size**0.5

    @property
    def norm_adds_one(self) -> bool:
        return True

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        del out["mlp_bias"]
        return out


class MistralForCausalLM(LlamaForCausalLM):
    """A Mistral causal language model: Llama's layers, attention over a sliding
    window of `config.sliding_window` positions (in the forward pass and in the
    key/value cache of `generate`). Built from a [`boxwood.models.MistralConfig`][]."""

    config_class: ClassVar[type] = MistralConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    """A Qwen2 (and Qwen2.5) causal language model: Llama's layers with biases on
    the query, key and value projections, and sliding-window layers where the
    config asks for them. Built from a [`boxwood.models.Qwen2Config`][]."""

    config_class: ClassVar[type] = Qwen2Config


class GemmaForCausalLM(LlamaForCausalLM):
    """A Gemma (first generation) causal language model: Llama's layers with
    token embeddings scaled by `sqrt(hidden_size)`, `(1 + weight)` RMSNorms and
    the tanh GELU. Built from a [`boxwood.models.GemmaConfig`][]."""

    config_class: ClassVar[type] = GemmaConfig
