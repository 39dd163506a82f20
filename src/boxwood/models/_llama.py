"""Llama (`LlamaForCausalLM`): RMSNorm, rotary positions (optionally scaled),
grouped-query attention (optionally over a sliding window), SwiGLU, tied or
untied output embedding. The hooks of `LlamaConfig` (`projection_biases`,
`layer_windows`, `embedding_scale`, `norm_adds_one`) let the variants of
`_llama_variants.py` (Mistral, Qwen2, Gemma) reuse these layers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .. import _init
from .._init import split_keys
from .._module import Module, field
from ..nn import Dropout, Embedding, Linear, RMSNorm, Stacked, State, StateIndex
from . import _training as training
from ._attend import Implementation, Step, attend, check_implementation
from ._blocks import (
    Cache,
    activation,
    empty_cache_index,
    init_cache,
    rope_at,
    run_blocks,
    supported_activation,
    with_last,
    write_cache,
)
from ._causal_lm import CausalLM
from ._classification import (
    DEFAULT_LABELS,
    LABEL_OPTIONS,
    check_problem_type,
    read_labels,
    write_labels,
)
from ._model_config import (
    ConfigError,
    ModelConfig,
    check_initializer_range,
    check_rates,
)
from ._rope_scaling import (
    Scaling,
    attention_scaling,
    frequencies_at,
    is_dynamic,
    normalise_scaling,
    read_rope,
    scaling_dict,
)

# The most positions of a model with `dynamic` RoPE scaling: its angles are
# `float32(position) * frequency`, and float32 holds every integer up to 2**24.
UNBOUNDED_POSITIONS = 2**24


def _one(value: Any) -> bool:
    return value in (None, 1)


@dataclasses.dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """The options of a Llama `config.json` that boxwood implements (names and
    defaults as in `transformers.LlamaConfig`).

    `rope_scaling` holds the RoPE scaling (`linear`, `llama3` or `dynamic`) as sorted
    `(key, value)` pairs, or `None`; a dict is accepted too. In `config.json` it is
    read from, and written as, `rope_parameters` (or the older `rope_scaling`).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    rope_scaling: Scaling | Mapping[str, Any] = None  # kept as `Scaling`
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    # read by `LlamaForSequenceClassification` (`id2label`, its loss's choice)
    labels: tuple[str, ...] = DEFAULT_LABELS
    problem_type: str | None = None

    model_type: ClassVar[str] = "llama"
    architecture: ClassVar[str] = "LlamaForCausalLM"
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ("mistral",)
    IGNORED: ClassVar[frozenset[str]] = frozenset({"pretraining_tp"})
    REQUIRED: ClassVar[dict] = {
        "sliding_window": (
            lambda v: v is None,
            "only `null` (full attention; boxwood.models.MistralForCausalLM "
            "reads Mistral's sliding window)",
        ),
        "num_experts": (_one, "only dense models"),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.rope_scaling, Mapping):
            scaling = normalise_scaling(self.rope_scaling, "`rope_scaling`")
            object.__setattr__(self, "rope_scaling", scaling)

    READ_OPTIONS: ClassVar[frozenset[str]] = LABEL_OPTIONS

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @classmethod
    def from_dict(cls, options: Any, source: str = "") -> Any:
        options = read_labels(options, f"{source}: " if source else "")
        theta, scaling = read_rope(options, 10000.0, f"{source}: " if source else "")
        options["rope_theta"], options["rope_scaling"] = theta, scaling
        return super().from_dict(options, source)

    def validate(self, where: str) -> None:
        if not supported_activation(self.hidden_act):
            raise ConfigError(
                f"{where}the option `hidden_act` = {self.hidden_act!r} is not supported."
            )
        if self.num_attention_heads % self.kv_heads:
            raise ConfigError(
                f"{where}`num_attention_heads` ({self.num_attention_heads}) must be a "
                f"multiple of `num_key_value_heads` ({self.kv_heads})."
            )
        check_rates(self, ("attention_dropout",), where)
        check_initializer_range(self, where)
        check_problem_type(self.problem_type, self.num_labels, where)

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def projection_biases(self) -> tuple[bool, bool]:
        """Whether q/k/v and the attention output have biases."""
        return self.attention_bias, self.attention_bias

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding attention window (`None`: full causal attention)."""
        return (None,) * self.num_hidden_layers

    @property
    def embedding_scale(self) -> float | None:
        """What the token embeddings are multiplied by (`None`: nothing)."""
        return None

    @property
    def norm_adds_one(self) -> bool:
        """Whether the RMSNorms multiply by `1 + weight` (Gemma) or `weight`."""
        return False

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        theta, scaling = out.pop("rope_theta"), self.rope_scaling
        out.pop("rope_scaling")
        out["rope_parameters"] = scaling_dict(theta, cast(Scaling, scaling))
        return write_labels(out)


class LlamaAttention(Module):
    """Grouped-query self-attention with rotary positions, over a key/value cache
    (see `_blocks.write_cache` and `_attend.attend`). Each head count sits
    with the projections it splits; the parameters keep `transformers`' names and order."""

    num_heads: int = field(static=True)
    q_proj: Linear
    kv_heads: int = field(static=True)  # of `k_proj` and `v_proj`
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    attention_dropout: Dropout  # on the attention probabilities
    theta: float = field(static=True)  # the RoPE base
    rope_scaling: Scaling = field(static=True)  # `_rope_scaling.attention_scaling`

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        kq, kk, kv, ko = split_keys(key, 4)
        d, hd, std = config.hidden_size, config.dim, config.initializer_range
        qkv_bias, o_bias = config.projection_biases
        heads, kv_heads = config.num_attention_heads, config.kv_heads
        self.q_proj = training.linear(d, heads * hd, dtype, std, key=kq, bias=qkv_bias)
        self.k_proj = training.linear(
            d, kv_heads * hd, dtype, std, key=kk, bias=qkv_bias
        )
        self.v_proj = training.linear(
            d, kv_heads * hd, dtype, std, key=kv, bias=qkv_bias
        )
        self.o_proj = training.linear(heads * hd, d, dtype, std, key=ko, bias=o_bias)
        self.attention_dropout = Dropout(config.attention_dropout)
        self.num_heads, self.kv_heads = heads, kv_heads
        self.theta = float(config.rope_theta)
        scaling = cast(Scaling, config.rope_scaling)  # normalised
        self.rope_scaling = attention_scaling(scaling, config.max_position_embeddings)

    def __call__(
        self, x: Array, step: Step, cache: Cache, layer: Array, window: Any
    ) -> tuple:
        seq = x.shape[0]
        q = jax.vmap(self.q_proj)(x).reshape(seq, self.num_heads, -1)
        k = jax.vmap(self.k_proj)(x).reshape(seq, self.kv_heads, -1)
        v = jax.vmap(self.v_proj)(x).reshape(seq, self.kv_heads, -1)
        positions = step.positions(seq)
        freqs = frequencies_at(
            q.shape[-1], self.theta, self.rope_scaling, positions, step.extent
        )
        q, k = rope_at(q, positions, freqs), rope_at(k, positions, freqs)
        k, v, cache = write_cache(cache, layer, k, v, step.start)
        key = training.layer_key(step.key, layer)
        out = attend(q, k, v, step, window, dropout=self.attention_dropout, key=key)
        return jax.vmap(self.o_proj)(out.reshape(seq, -1)), cache


class LlamaMLP(Module):
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear
    act: str = field(static=True)

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        kg, ku, kd = split_keys(key, 3)
        d, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        std = config.initializer_range
        self.gate_proj = training.linear(d, inner, dtype, std, key=kg, bias=bias)
        self.up_proj = training.linear(d, inner, dtype, std, key=ku, bias=bias)
        self.down_proj = training.linear(inner, d, dtype, std, key=kd, bias=bias)
        self.act = config.hidden_act

    def __call__(self, x: Array) -> Array:
        gate = activation(self.act, jax.vmap(self.gate_proj)(x))
        return jax.vmap(self.down_proj)(gate * jax.vmap(self.up_proj)(x))


class GemmaRMSNorm(Module):
    """Gemma's RMSNorm: `x / sqrt(mean(x**2) + eps) * (1 + weight)`, computed in
    float32 and returned in `x`'s dtype. The checkpoint stores the offset from
    one (`weight`, zeros at initialisation)."""

    weight: Array
    eps: float = field(static=True)

    def __init__(self, size: int, eps: float, dtype: Any):
        self.weight = _init.zeros((size,), dtype)
        self.eps = eps

    def __call__(self, x: Float[Array, " size"]) -> Float[Array, " size"]:
        wide = x.astype(jnp.float32)
        scaled = wide * jax.lax.rsqrt(jnp.mean(wide * wide) + self.eps)
        return (scaled * (1.0 + self.weight.astype(jnp.float32))).astype(x.dtype)


def _norm(config: LlamaConfig, dtype: Any) -> RMSNorm | GemmaRMSNorm:
    if config.norm_adds_one:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
    return RMSNorm(config.hidden_size, config.rms_norm_eps, use_bias=False, dtype=dtype)


class LlamaDecoderLayer(Module):
    input_layernorm: RMSNorm | GemmaRMSNorm
    self_attn: LlamaAttention
    post_attention_layernorm: RMSNorm | GemmaRMSNorm
    mlp: LlamaMLP

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        self.input_layernorm = _norm(config, dtype)
        self.self_attn = LlamaAttention(config, dtype, key=k1)
        self.post_attention_layernorm = _norm(config, dtype)
        self.mlp = LlamaMLP(config, dtype, key=k2)

    def __call__(
        self, x: Array, step: Step, cache: Cache, layer: Array, window: Any = None
    ) -> tuple:
        normed = jax.vmap(self.input_layernorm)(x)
        h, cache = self.self_attn(normed, step, cache, layer, window)
        x = x + h
        return x + self.mlp(jax.vmap(self.post_attention_layernorm)(x)), cache


class LlamaModel(Module):
    """The Llama body. The decoder layers are stored stacked (`layers`, a
    `boxwood.nn.Stacked`: `layers[i]` is layer `i`) and applied in one
    `lax.scan`; their sliding windows (`windows`, one per layer, `None`: full
    attention) are data of the scan where they differ. The key/value cache of
    all layers is one `State` entry (`cache`)."""

    embed_tokens: Embedding
    layers: Stacked
    norm: RMSNorm | GemmaRMSNorm
    cache: StateIndex
    embed_scale: float | None = field(static=True)  # Gemma's `sqrt(hidden_size)`
    windows: tuple[int | None, ...] = field(static=True)

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        keys = split_keys(key, 2)
        self.embed_tokens = training.embedding(
            config.vocab_size,
            config.hidden_size,
            dtype,
            config.initializer_range,
            key=keys[0],
            padding_row=config.pad_token_id,  # `transformers`' padding index
        )
        self.layers = Stacked(
            lambda k: LlamaDecoderLayer(config, dtype, key=k),
            config.num_hidden_layers,
            key=keys[1],
        )
        self.norm = _norm(config, dtype)
        self.cache = empty_cache_index()
        self.embed_scale = config.embedding_scale
        self.windows = tuple(config.layer_windows())

    def __call__(self, input_ids: Array, step: Step, state: State | None) -> tuple:
        x = self.embed_tokens.weight[input_ids]
        if self.embed_scale is not None:
            # rounded to the activations' dtype first, as `transformers` does
            x = x * jnp.asarray(self.embed_scale, x.dtype)
        x, state, every = run_blocks(
            self.layers, x, step, self.cache, state, self.windows
        )
        x = jax.vmap(self.norm)(x)
        return x, state, with_last(every, x)


class LlamaForCausalLM(CausalLM):
    """A Llama-family causal language model (Llama 1-3.x, with `linear`,
    `llama3` or `dynamic` RoPE scaling; Mistral configs without a sliding window).

    Parameter names are those of the `transformers` checkpoint
    (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`); `lm_head` is
    `None` when the config ties the output to the input embedding.
    """

    model: LlamaModel
    lm_head: Linear | None
    config: LlamaConfig = field(static=True)
    attention_implementation: Implementation = field(static=True)

    config_class: ClassVar[type] = LlamaConfig
    DROPPED: ClassVar[str | None] = r".*rotary_emb\.inv_freq"
    # `LlamaForSequenceClassification`'s head, dropped from its files
    OTHER_HEADS: ClassVar[str | None] = r"score\..*"
    # an untied `lm_head` a file lacks (a sequence classifier's, which has none)
    # is drawn anew, as `transformers` initialises it
    NEW_ON_LOAD: ClassVar[str | None] = r"lm_head\.weight"
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = (
        ("model.embed_tokens.weight", "embedding"),
        ("lm_head.weight", "normal"),  # skipped where tied (`None`)
    )

    def __init__(
        self,
        config: LlamaConfig,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        attention_implementation: Implementation = None,
    ):
        """**Arguments:**

        - `config`: a [`boxwood.models.LlamaConfig`][].
        - `dtype`: the parameters' dtype (default float32).
        - `key`: a `jax.random` key for the random initialisation. (Keyword only.)
        - `attention_implementation`: `None`, `"xla"`, `"cudnn"` or `"splash"`
          (see `with_attention_implementation`).
          (Keyword only.)
        """
        check_implementation(type(self).__name__, attention_implementation)
        k1, k2 = split_keys(key, 2)
        dtype = dtype or jnp.float32
        self.model = LlamaModel(config, dtype, key=k1)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else training.linear(
                config.hidden_size,
                config.vocab_size,
                dtype,
                config.initializer_range,
                key=k2,
                bias=False,
            )
        )
        self.config = config
        self.attention_implementation = attention_implementation

    @classmethod
    def tied_tensors(cls, config: Any) -> dict[str, str]:
        if not config.tie_word_embeddings:
            return {}
        return {"lm_head.weight": "model.embed_tokens.weight"}

    def body(self) -> LlamaModel:
        return self.model

    @staticmethod
    def blocks(model: Any) -> Stacked:
        return model.model.layers

    def output_embedding(self) -> Float[Array, "vocab_size hidden_size"]:
        """The matrix `W` of the output projection, `logits = hidden @ W.T`:
        `lm_head.weight`, or the token embedding when they are tied."""
        if self.lm_head is None:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def init_cache(self, length: int) -> State:
        """An empty key/value cache for `length` positions, as a `boxwood.nn.State`."""
        c = self.config
        dtype = self.model.embed_tokens.weight.dtype
        return init_cache(
            self,
            length,
            dict(
                depth=c.num_hidden_layers,
                kv_heads=c.kv_heads,
                head_dim=c.dim,
                dtype=dtype,
            ),
        )

    @property
    def max_positions(self) -> int:
        """`max_position_embeddings`; with `dynamic` RoPE scaling, which exists to
        run past it, `UNBOUNDED_POSITIONS`."""
        if self.uses_extent:
            return UNBOUNDED_POSITIONS
        return self.config.max_position_embeddings

    @property
    def uses_extent(self) -> bool:
        """Whether the outputs depend on `decode`'s `extent` (`dynamic` RoPE)."""
        return is_dynamic(cast(Scaling, self.config.rope_scaling))
