"""Llama (`LlamaForCausalLM`, also Mistral-shaped configs): RMSNorm, rotary
positions, grouped-query attention, SwiGLU, tied or untied output embedding."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from ..nn import Embedding, Linear, RMSNorm, State, StateIndex
from ._config import ConfigError, ModelConfig
from ._layers import (
    activation,
    attend_with_cache,
    check_input_ids,
    empty_cache_index,
    init_cache,
    rope_at,
    supported_activation,
)
from ._pretrained import Pretrained


def _default_rope(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, dict) and value.get("rope_type", value.get("type")) in (
        None,
        "default",
    )


def _one(value: Any) -> bool:
    return value in (None, 1)


@dataclasses.dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """The options of a Llama (or Mistral) `config.json` that boxwood implements
    (names and defaults as in `transformers.LlamaConfig`)."""

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

    model_type: ClassVar[str] = "llama"
    architecture: ClassVar[str] = "LlamaForCausalLM"
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ("mistral",)
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"attention_dropout", "pretraining_tp"}
    )
    REQUIRED: ClassVar[dict] = {
        "rope_scaling": (_default_rope, "only `null` (no RoPE scaling)"),
        "sliding_window": (lambda v: v is None, "only `null` (full attention)"),
        "num_experts": (_one, "only dense models"),
    }

    @classmethod
    def from_dict(cls, options: Any, source: str = "") -> LlamaConfig:
        options = dict(options)
        rope = options.pop("rope_parameters", None)
        if rope is not None:
            _require_default_rope(rope, source)
            options.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
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

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": out.pop("rope_theta"),
        }
        return out


def _require_default_rope(rope: Any, source: str) -> None:
    if not _default_rope(rope):
        raise ConfigError(
            f"{source}: the option `rope_parameters` = {rope!r} is not supported by "
            "boxwood.models.LlamaForCausalLM: it supports only the default RoPE "
            "(`rope_type` = 'default')."
        )


class LlamaAttention(Module):
    """Grouped-query self-attention with rotary positions, over a key/value cache
    (see `_layers.attend_with_cache`). Each head count sits with the projections
    it splits; the parameters keep `transformers`' names and order."""

    num_heads: int = field(static=True)
    q_proj: Linear
    kv_heads: int = field(static=True)  # of `k_proj` and `v_proj`
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    theta: float = field(static=True)  # the RoPE base
    cache: StateIndex

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        kq, kk, kv, ko = split_keys(key, 4)
        d, hd, bias = config.hidden_size, config.dim, config.attention_bias
        heads, kv_heads = config.num_attention_heads, config.kv_heads
        self.q_proj = Linear(d, heads * hd, use_bias=bias, dtype=dtype, key=kq)
        self.k_proj = Linear(d, kv_heads * hd, use_bias=bias, dtype=dtype, key=kk)
        self.v_proj = Linear(d, kv_heads * hd, use_bias=bias, dtype=dtype, key=kv)
        self.o_proj = Linear(heads * hd, d, use_bias=bias, dtype=dtype, key=ko)
        self.cache = empty_cache_index()
        self.num_heads, self.kv_heads = heads, kv_heads
        self.theta = float(config.rope_theta)

    def __call__(self, x: Array, state: State | None, start: Any) -> tuple:
        seq = x.shape[0]
        q = jax.vmap(self.q_proj)(x).reshape(seq, self.num_heads, -1)
        k = jax.vmap(self.k_proj)(x).reshape(seq, self.kv_heads, -1)
        v = jax.vmap(self.v_proj)(x).reshape(seq, self.kv_heads, -1)
        positions = start + jnp.arange(seq)
        q, k = rope_at(q, positions, self.theta), rope_at(k, positions, self.theta)
        out, state = attend_with_cache(self.cache, state, q, k, v, start)
        return jax.vmap(self.o_proj)(out.reshape(seq, -1)), state


class LlamaMLP(Module):
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear
    act: str = field(static=True)

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        kg, ku, kd = split_keys(key, 3)
        d, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Linear(d, inner, use_bias=bias, dtype=dtype, key=kg)
        self.up_proj = Linear(d, inner, use_bias=bias, dtype=dtype, key=ku)
        self.down_proj = Linear(inner, d, use_bias=bias, dtype=dtype, key=kd)
        self.act = config.hidden_act

    def __call__(self, x: Array) -> Array:
        gate = activation(self.act, jax.vmap(self.gate_proj)(x))
        return jax.vmap(self.down_proj)(gate * jax.vmap(self.up_proj)(x))


class LlamaDecoderLayer(Module):
    input_layernorm: RMSNorm
    self_attn: LlamaAttention
    post_attention_layernorm: RMSNorm
    mlp: LlamaMLP

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        norm = lambda: RMSNorm(
            config.hidden_size, config.rms_norm_eps, use_bias=False, dtype=dtype
        )
        self.input_layernorm = norm()
        self.self_attn = LlamaAttention(config, dtype, key=k1)
        self.post_attention_layernorm = norm()
        self.mlp = LlamaMLP(config, dtype, key=k2)

    def __call__(self, x: Array, state: State | None, start: Any) -> tuple:
        h, state = self.self_attn(jax.vmap(self.input_layernorm)(x), state, start)
        x = x + h
        return x + self.mlp(jax.vmap(self.post_attention_layernorm)(x)), state


class LlamaModel(Module):
    embed_tokens: Embedding
    layers: list[LlamaDecoderLayer]
    norm: RMSNorm

    def __init__(self, config: LlamaConfig, dtype: Any, *, key: PRNGKeyArray):
        keys = split_keys(key, config.num_hidden_layers + 1)
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, key=keys[0]
        )
        self.layers = [LlamaDecoderLayer(config, dtype, key=k) for k in keys[1:]]
        self.norm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, use_bias=False, dtype=dtype
        )

    def __call__(self, input_ids: Array, state: State | None, start: Any) -> tuple:
        x = self.embed_tokens.weight[input_ids]
        for layer in self.layers:
            x, state = layer(x, state, start)
        return jax.vmap(self.norm)(x), state


class LlamaForCausalLM(Pretrained):
    """A Llama-family causal language model (Llama 1-3, Mistral-shaped configs
    without sliding windows).

    Parameter names are those of the `transformers` checkpoint
    (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`); `lm_head` is
    `None` when the config ties the output to the input embedding.
    """

    model: LlamaModel
    lm_head: Linear | None
    config: LlamaConfig = field(static=True)

    config_class: ClassVar[type] = LlamaConfig
    DROPPED: ClassVar[str | None] = r".*rotary_emb\.inv_freq"

    def __init__(self, config: LlamaConfig, dtype: Any = None, *, key: PRNGKeyArray):
        """**Arguments:**

        - `config`: a [`boxwood.models.LlamaConfig`][].
        - `dtype`: the parameters' dtype (default float32).
        - `key`: a `jax.random` key for the random initialisation. (Keyword only.)
        """
        k1, k2 = split_keys(key, 2)
        dtype = dtype or jnp.float32
        self.model = LlamaModel(config, dtype, key=k1)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(
                config.hidden_size,
                config.vocab_size,
                use_bias=False,
                dtype=dtype,
                key=k2,
            )
        )
        self.config = config

    def __call__(self, input_ids: Int[Array, " seq"]) -> Float[Array, "seq vocab_size"]:
        """**Arguments:** `input_ids`: token ids, shape `(seq,)`.

        **Returns:** the next-token logits at every position, `(seq, vocab_size)`.
        """
        return self.decode(input_ids, None, 0)[0]

    def decode(self, input_ids: Array, state: State | None, start: Any) -> tuple:
        """Logits for `input_ids` at positions `start, start+1, ...`, reading and
        updating the key/value cache in `state` (from `init_cache`)."""
        check_input_ids(
            "LlamaForCausalLM", input_ids, self.config.max_position_embeddings
        )
        x, state = self.model(input_ids, state, start)
        head = (
            self.model.embed_tokens.weight
            if self.lm_head is None
            else self.lm_head.weight
        )
        return x @ head.T, state

    def init_cache(self, length: int) -> State:
        """An empty key/value cache for `length` positions, as a `boxwood.nn.State`."""
        c = self.config
        dtype = self.model.embed_tokens.weight.dtype
        return init_cache(
            self, length, dict(kv_heads=c.kv_heads, head_dim=c.dim, dtype=dtype)
        )

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings
