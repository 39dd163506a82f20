"""The sizes `benchmarks/accelerator.py` measures, and the arithmetic its
contenders share: model options (`transformers`' names), parameter counts and
bytes, model FLOPs per token.

Full sizes: GPT-2-small (124M) trained at 16 x 1024 tokens, a Llama-style model
of 852M parameters (hidden 2048, 16 layers, 32 query and 8 key/value heads,
intermediate 5632, vocabulary 32000, untied head) at 4 x 2048, greedy generation
of GPT-2-small (128 tokens after 32) at batch 1 and 32. `quick` sizes are tiny,
to check the script on a CPU (sequences of 128: splash attention's lane width).
"""

from __future__ import annotations

import dataclasses
from typing import Any

TRAIN = "training step (bf16 parameters, AdamW, float32 loss)"
GENERATE = "greedy generation (GPT-2, bf16)"
DEVICE = "the device"
MEMORY = "memory of a training step (compiled.memory_analysis)"

# Result columns, in the table's order; `bound` holds the device's limit.
CONTENDERS = (
    "boxwood", "boxwood, whole logits", "boxwood, unrolled", "pure JAX",
    "Flax NNX", "Equinox",
    "boxwood, dropout (rbg)", "boxwood, dropout (threefry)", "bound",
)  # fmt: skip
LIBS = {"boxwood": "boxwood", "boxwood_unrolled": "boxwood, unrolled",
        "boxwood_whole": "boxwood, whole logits",
        "boxwood_dropout_rbg": "boxwood, dropout (rbg)",
        "boxwood_dropout_threefry": "boxwood, dropout (threefry)",
        "jax": "pure JAX",
        "nnx": "Flax NNX", "eqx": "Equinox"}  # fmt: skip
# boxwood's contenders: each `lib` and the `with_unroll` setting of its blocks
# (1: scanned one block at a time; True: a Python loop, no scan)
BOXWOOD_UNROLL = {"boxwood": 1, "boxwood_unrolled": True, "boxwood_whole": 1,
                  "boxwood_dropout_rbg": 1, "boxwood_dropout_threefry": 1}  # fmt: skip
# the loss of boxwood's contenders: `causal_lm_loss` (chunked) or the whole
# float32 logits, as the hand-written step takes it
BOXWOOD_LOSS = {"boxwood_whole": "whole"}
# the dropout of boxwood's contenders: the generator of the masks (GPT-2's
# config rates, 0.1, on the embeddings and the residual branches; none on the
# attention probabilities, which would replace the fused attention kernel)
BOXWOOD_DROPOUT = {"boxwood_dropout_rbg": "rbg", "boxwood_dropout_threefry": "threefry"}


@dataclasses.dataclass(frozen=True)
class TrainCase:
    """One training figure: a model (`gpt2` or `llama`) and its batch."""

    name: str
    title: str
    options: dict[str, Any]
    batch: int
    seq: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def label(self) -> str:
        return f"{self.title}, {self.batch} x {self.seq}"

    @property
    def layers(self) -> int:
        o = self.options
        return o["n_layer"] if self.name == "gpt2" else o["num_hidden_layers"]

    @property
    def width(self) -> int:
        """Heads x head size of the queries (the width of `q @ k.T` and `w @ v`)."""
        o = self.options
        return o["n_embd"] if self.name == "gpt2" else o["hidden_size"]

    @property
    def params(self) -> int:
        return parameter_count(self.name, self.options)

    @property
    def product_params(self) -> int:
        """The parameters of the weight products: every block's matrices and the
        output projection; not the input embedding lookups (GPT-2's `wpe`, the
        Llama's untied `embed_tokens`: no product reads them; GPT-2's `wte` is
        counted once, as the tied output projection), biases or norms."""
        return product_parameter_count(self.name, self.options)

    @property
    def flops_per_token(self) -> float:
        """Model FLOPs of one trained token: `6 * product_params` (forward and
        backward of every weight product's multiply-add) plus attention's two
        `seq x seq` products, `12 * layers * width * seq` (the causal half not
        subtracted), as in PaLM's MFU. Rematerialised work is not counted."""
        return 6.0 * self.product_params + 12.0 * self.layers * self.width * self.seq


def parameter_count(name: str, o: dict[str, Any]) -> int:
    if name == "gpt2":
        d, layers = o["n_embd"], o["n_layer"]
        block = 12 * d * d + 13 * d  # qkv, projection, MLP (4d), biases, 2 norms
        return (o["vocab_size"] + o["n_positions"]) * d + layers * block + 2 * d
    d, layers, inner = o["hidden_size"], o["num_hidden_layers"], o["intermediate_size"]
    hd = d // o["num_attention_heads"]
    attn = d * hd * (2 * o["num_attention_heads"] + 2 * o["num_key_value_heads"])
    block = attn + 3 * d * inner + 2 * d
    heads = 1 if o.get("tie_word_embeddings", True) else 2
    return heads * o["vocab_size"] * d + layers * block + d


def product_parameter_count(name: str, o: dict[str, Any]) -> int:
    """`parameter_count` less what no matrix product reads (see
    `TrainCase.product_params`)."""
    if name == "gpt2":
        d = o["n_embd"]
        return o["vocab_size"] * d + o["n_layer"] * 12 * d * d
    d, layers, inner = o["hidden_size"], o["num_hidden_layers"], o["intermediate_size"]
    hd = d // o["num_attention_heads"]
    attn = d * hd * (2 * o["num_attention_heads"] + 2 * o["num_key_value_heads"])
    return o["vocab_size"] * d + layers * (attn + 3 * d * inner)


@dataclasses.dataclass(frozen=True)
class GenerateCase:
    options: dict[str, Any]  # GPT-2 options
    prompt: int
    new_tokens: int
    batches: tuple[int, ...]

    @property
    def param_bytes(self) -> int:
        return 2 * parameter_count("gpt2", self.options)  # bfloat16

    def label(self, batch: int) -> str:
        return f"batch {batch}, {self.prompt} + {self.new_tokens} tokens"


def gpt2_options(quick: bool) -> dict[str, Any]:
    if quick:
        return dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=256)
    return dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)


def llama_options(quick: bool) -> dict[str, Any]:
    if quick:
        sizes = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=352)
        heads = dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
        return dict(
            **sizes, **heads, max_position_embeddings=256, tie_word_embeddings=False
        )
    return dict(
        hidden_size=2048,
        num_hidden_layers=16,
        intermediate_size=5632,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )


def train_cases(
    quick: bool, sizes: dict[str, tuple[int, int]] | None = None
) -> dict[str, TrainCase]:
    """`sizes` may give `(batch, seq)` for `gpt2` and `llama`."""
    sizes = sizes or {}
    gpt2 = "GPT-2-small (124M)" if not quick else "GPT-2 tiny (quick)"
    llama = "Llama-style 852M" if not quick else "Llama tiny (quick)"
    default = {"gpt2": (4, 128) if quick else (16, 1024),
               "llama": (2, 128) if quick else (4, 2048)}  # fmt: skip
    shape = {k: sizes.get(k) or v for k, v in default.items()}
    return {
        "gpt2": TrainCase("gpt2", gpt2, gpt2_options(quick), *shape["gpt2"]),
        "llama": TrainCase("llama", llama, llama_options(quick), *shape["llama"]),
    }


def generate_case(quick: bool) -> GenerateCase:
    if quick:
        return GenerateCase(
            gpt2_options(True), prompt=8, new_tokens=16, batches=(1, 32)
        )
    return GenerateCase(gpt2_options(False), prompt=32, new_tokens=128, batches=(1, 32))


def peak_size(backend: str, quick: bool) -> int:
    """The side of the square bf16 matmul that measures the device's peak."""
    if backend == "cpu":
        return 512 if quick else 2048
    return 8192


def bandwidth_bytes(backend: str, quick: bool) -> int:
    """The size of the array copied and summed to measure memory bandwidth."""
    if backend == "cpu":
        return (16 if quick else 64) << 20
    return 1 << 30
