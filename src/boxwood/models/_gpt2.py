"""GPT-2 (`GPT2LMHeadModel`): learned positions, pre-LayerNorm blocks, fused
query/key/value projection, tied output embedding."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from ..nn import Dropout, Embedding, LayerNorm, Stacked, State, StateIndex
from . import _training as training
from ._attend import Implementation, Step, attend, check_implementation
from ._blocks import (
    ACTIVATION_NAMES,
    Cache,
    activation,
    empty_cache_index,
    init_cache,
    run_blocks,
    with_last,
    write_cache,
)
from ._causal_lm import CausalLM
from ._checkpoint_files import FileLayout
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
    false_or_unset,
)


@dataclasses.dataclass(frozen=True)
class GPT2Config(ModelConfig):
    """The options of a GPT-2 `config.json` that boxwood implements (names and
    defaults as in `transformers.GPT2Config`)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    # read by `GPT2ForSequenceClassification` (`id2label`, its loss's choice)
    labels: tuple[str, ...] = DEFAULT_LABELS
    problem_type: str | None = None

    model_type: ClassVar[str] = "gpt2"
    architecture: ClassVar[str] = "GPT2LMHeadModel"
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"n_ctx", "reorder_and_upcast_attn"}
        | {f"summary_{x}" for x in ("activation", "first_dropout", "type")}
        | {"summary_proj_to_labels", "summary_use_proj"}
    )
    REQUIRED: ClassVar[dict] = {
        "add_cross_attention": (false_or_unset, "only `false` (no cross-attention)"),
        "scale_attn_by_inverse_layer_idx": (false_or_unset, "only `false`"),
    }
    READ_OPTIONS: ClassVar[frozenset[str]] = LABEL_OPTIONS

    @classmethod
    def from_dict(cls, options: Any, source: str = "") -> GPT2Config:
        where = f"{source}: " if source else ""
        return super().from_dict(read_labels(options, where), source)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return write_labels(super().to_dict())

    def validate(self, where: str) -> None:
        if self.activation_function not in ACTIVATION_NAMES:
            raise ConfigError(
                f"{where}the option `activation_function` = "
                f"{self.activation_function!r} is not supported; supported: "
                f"{', '.join(ACTIVATION_NAMES)}."
            )
        if not self.scale_attn_weights:
            raise ConfigError(
                f"{where}the option `scale_attn_weights` = false is not supported."
            )
        if not self.tie_word_embeddings:
            raise ConfigError(
                f"{where}the option `tie_word_embeddings` = false is not supported by "
                "GPT2LMHeadModel (GPT-2 ties its output to its input embedding)."
            )
        if self.n_embd % self.n_head:
            raise ConfigError(f"{where}`n_embd` must be divisible by `n_head`.")
        check_rates(self, ("embd_pdrop", "attn_pdrop", "resid_pdrop"), where)
        check_initializer_range(self, where)
        check_problem_type(self.problem_type, self.num_labels, where)


class Conv1D(Module):
    """GPT-2's projection layer: a dense layer whose weight is stored `(in_features,
    out_features)`, as the checkpoint stores it, so that loading and export copy it
    as it is (no transpose of the 85M weights of GPT-2 small). Initialised as
    `transformers` does: weight `N(0, std)`, bias zeros."""

    weight: Float[Array, "in_features out_features"]
    bias: Float[Array, " out_features"]

    def __init__(
        self,
        in_features: int,
        out_features: int,
        dtype: Any,
        std: float = 0.02,
        *,
        key: PRNGKeyArray,
    ):
        shape = (in_features, out_features)
        self.weight = training.draw(training.normal(std), key, shape, dtype)
        self.bias = training.zeros(key, (out_features,), dtype)

    def __call__(
        self, x: Float[Array, "seq in_features"]
    ) -> Float[Array, "seq out_features"]:
        return x @ self.weight + self.bias[None, :]


def _projection_std(config: GPT2Config) -> float:
    """The standard deviation of the projections back into the residual stream
    (`c_proj`): `initializer_range / sqrt(2 * n_layer)`, as `transformers` draws
    them (two residual additions per block)."""
    return config.initializer_range / math.sqrt(2 * config.n_layer)


class GPT2Attention(Module):
    """Causal self-attention with one fused `c_attn` projection (as GPT-2 stores
    it); dropout on the attention probabilities (`attn_dropout`, `attn_pdrop`) and
    on the output (`resid_dropout`, `resid_pdrop`)."""

    c_attn: Conv1D
    c_proj: Conv1D
    attn_dropout: Dropout
    resid_dropout: Dropout
    num_heads: int = field(static=True)

    def __init__(self, config: GPT2Config, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        d, std = config.n_embd, config.initializer_range
        self.c_attn = Conv1D(d, 3 * d, dtype, std, key=k1)
        self.c_proj = Conv1D(d, d, dtype, _projection_std(config), key=k2)
        self.attn_dropout = Dropout(config.attn_pdrop)
        self.resid_dropout = Dropout(config.resid_pdrop)
        self.num_heads = config.n_head

    def __call__(
        self, x: Array, step: Step, cache: Cache, layer: Array, key: Any = None
    ) -> tuple:
        k_attn, k_out = training.split(key, 2)
        qkv = self.c_attn(x).reshape(x.shape[0], 3, self.num_heads, -1)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        k, v, cache = write_cache(cache, layer, k, v, step.start)
        out = attend(q, k, v, step, dropout=self.attn_dropout, key=k_attn)
        out = self.c_proj(out.reshape(x.shape[0], -1))
        return self.resid_dropout(out, key=k_out), cache


class GPT2MLP(Module):
    c_fc: Conv1D
    c_proj: Conv1D
    dropout: Dropout
    act: str = field(static=True)

    def __init__(self, config: GPT2Config, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        inner = config.n_inner or 4 * config.n_embd
        std = config.initializer_range
        self.c_fc = Conv1D(config.n_embd, inner, dtype, std, key=k1)
        self.c_proj = Conv1D(
            inner, config.n_embd, dtype, _projection_std(config), key=k2
        )
        self.dropout = Dropout(config.resid_pdrop)
        self.act = config.activation_function

    def __call__(self, x: Array, key: Any = None) -> Array:
        out = self.c_proj(activation(self.act, self.c_fc(x)))
        return self.dropout(out, key=key)


class GPT2Block(Module):
    ln_1: LayerNorm
    attn: GPT2Attention
    ln_2: LayerNorm
    mlp: GPT2MLP

    def __init__(self, config: GPT2Config, dtype: Any, *, key: PRNGKeyArray):
        k1, k2 = split_keys(key, 2)
        eps = config.layer_norm_epsilon
        self.ln_1 = LayerNorm(config.n_embd, eps=eps, dtype=dtype)
        self.attn = GPT2Attention(config, dtype, key=k1)
        self.ln_2 = LayerNorm(config.n_embd, eps=eps, dtype=dtype)
        self.mlp = GPT2MLP(config, dtype, key=k2)

    def __call__(
        self, x: Array, step: Step, cache: Cache, layer: Array, window: Any = None
    ) -> tuple:
        k_attn, k_mlp = training.split(training.layer_key(step.key, layer), 2)
        h, cache = self.attn(jax.vmap(self.ln_1)(x), step, cache, layer, k_attn)
        x = x + h
        return x + self.mlp(jax.vmap(self.ln_2)(x), k_mlp), cache


class GPT2Model(Module):
    """GPT-2's body. The blocks are stored stacked (`h`, a `boxwood.nn.Stacked`:
    `h[i]` is block `i`) and applied in one `lax.scan`; the key/value cache of
    all of them is one `State` entry (`cache`). `drop` is the dropout on the
    embeddings (`embd_pdrop`)."""

    wte: Embedding
    wpe: Embedding
    drop: Dropout
    h: Stacked
    ln_f: LayerNorm
    cache: StateIndex

    def __init__(self, config: GPT2Config, dtype: Any, *, key: PRNGKeyArray):
        keys = split_keys(key, 3)
        d, std = config.n_embd, config.initializer_range
        self.wte = training.embedding(config.vocab_size, d, dtype, std, key=keys[0])
        self.wpe = training.embedding(config.n_positions, d, dtype, std, key=keys[1])
        self.drop = Dropout(config.embd_pdrop)
        self.h = Stacked(
            lambda k: GPT2Block(config, dtype, key=k), config.n_layer, key=keys[2]
        )
        self.ln_f = LayerNorm(d, eps=config.layer_norm_epsilon, dtype=dtype)
        self.cache = empty_cache_index()

    def __call__(self, input_ids: Array, step: Step, state: State | None) -> tuple:
        positions = step.position_rows(self.wpe.weight, input_ids.shape[0])
        x = self.wte.weight[input_ids] + positions
        # the layers' keys are `fold_in(step.key, layer)`; this one follows them
        x = self.drop(x, key=training.layer_key(step.key, len(self.h)))
        x, state, every = run_blocks(self.h, x, step, self.cache, state)
        x = jax.vmap(self.ln_f)(x)
        return x, state, with_last(every, x)


class GPT2LMHeadModel(CausalLM):
    """GPT-2 with its language-modelling head (tied to the token embedding).

    Built from a [`boxwood.models.GPT2Config`][]; usually loaded with
    `GPT2LMHeadModel.from_pretrained(path)`. Parameter names are those of the
    `transformers` checkpoint (`transformer.h.0.attn.c_attn.weight`), in its
    layout: the projections are GPT-2's `Conv1D` (weight `(in_features,
    out_features)`), unlike `boxwood.nn.Linear`.
    """

    transformer: GPT2Model
    config: GPT2Config = field(static=True)
    attention_implementation: Implementation = field(static=True)

    config_class: ClassVar[type] = GPT2Config
    # The Hub's `gpt2` file names the body's tensors without `transformer.` and
    # stores the attention's causal-mask buffers (`attn.bias`, `attn.masked_bias`).
    LAYOUTS: ClassVar[tuple[FileLayout, ...]] = (
        FileLayout(
            "GPT-2 body (names without `transformer.`)",
            ((r"^(wte|wpe|h|ln_f)\.", r"transformer.\1."),),
        ),
    )
    DROPPED: ClassVar[str | None] = r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"
    # `GPT2ForSequenceClassification`'s head, dropped from its files
    OTHER_HEADS: ClassVar[str | None] = r"score\..*"
    VOCABULARY: ClassVar[tuple[tuple[str, str], ...]] = (
        ("transformer.wte.weight", "normal"),  # no padding index in GPT-2
    )

    def __init__(
        self,
        config: GPT2Config,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        attention_implementation: Implementation = None,
    ):
        """**Arguments:**

        - `config`: a [`boxwood.models.GPT2Config`][].
        - `dtype`: the parameters' dtype (default float32).
        - `key`: a `jax.random` key for the random initialisation. (Keyword only.)
        - `attention_implementation`: `None`, `"xla"`, `"cudnn"` or `"splash"`
          (see `with_attention_implementation`).
          (Keyword only.)
        """
        check_implementation("GPT2LMHeadModel", attention_implementation)
        self.transformer = GPT2Model(config, dtype or jnp.float32, key=key)
        self.config = config
        self.attention_implementation = attention_implementation

    @classmethod
    def tied_tensors(cls, config: Any) -> dict[str, str]:
        return {"lm_head.weight": "transformer.wte.weight"}

    def body(self) -> GPT2Model:
        return self.transformer

    @staticmethod
    def blocks(model: Any) -> Stacked:
        return model.transformer.h

    def output_embedding(self) -> Float[Array, "vocab_size hidden_size"]:
        """The matrix `W` of the output projection, `logits = hidden @ W.T` (GPT-2
        ties it to the token embedding)."""
        return self.transformer.wte.weight

    def init_cache(self, length: int) -> State:
        """An empty key/value cache for `length` positions, as a `boxwood.nn.State`."""
        c = self.config
        dtype = self.transformer.wte.weight.dtype
        return init_cache(
            self,
            length,
            dict(
                depth=c.n_layer,
                kv_heads=c.n_head,
                head_dim=c.n_embd // c.n_head,
                dtype=dtype,
            ),
        )

    @property
    def max_positions(self) -> int:
        return self.config.n_positions
