"""The sizes `benchmarks/gpu.py` measures, and the arithmetic shared by its
contenders: model configs for boxwood and `transformers`, parameter counts and
model FLOPs.

Full sizes are issue #36's: GPT-2-small (124M) trained at 16 x 1024 tokens, a
Llama-style model of 852M parameters (hidden 2048, 16 layers, 32 query and 8
key/value heads, intermediate 5632, vocabulary 32000, untied head) at 4 x 2048,
greedy generation of GPT-2-small (64 tokens after 32) at batch 1 and 32. `quick`
sizes are tiny, to check the script on a CPU in about two minutes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from _timing import row

TRAIN = "training step (bf16, AdamW)"
GENERATE = "greedy generation (GPT-2)"
LOAD = "from_pretrained onto the device (GPT-2-small)"


@dataclasses.dataclass(frozen=True)
class TrainCase:
    """One training figure: a model config (`transformers`' option names) and the
    batch it is trained on."""

    name: str  # "gpt2" or "llama"
    title: str
    options: dict[str, Any]
    batch: int
    seq: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def layers(self) -> int:
        o = self.options
        return o["n_layer"] if self.name == "gpt2" else o["num_hidden_layers"]

    @property
    def attention_width(self) -> int:
        """Heads x head size of the queries (the width of `q @ k.T` and `w @ v`)."""
        o = self.options
        return o["n_embd"] if self.name == "gpt2" else o["hidden_size"]

    def flops_per_token(self, params: int) -> float:
        """Model FLOPs of one trained token: `6 * params` (forward and backward of
        every parameter's multiply-add) plus attention's two `seq x seq` products,
        `12 * layers * width * seq` (forward 4, backward 8; the causal half is not
        subtracted), as in PaLM's and llm.c's MFU."""
        return 6.0 * params + 12.0 * self.layers * self.attention_width * self.seq


@dataclasses.dataclass(frozen=True)
class GenerateCase:
    options: dict[str, Any]  # GPT-2 options
    prompt: int
    new_tokens: int
    batches: tuple[int, ...]


def gpt2_options(quick: bool) -> dict[str, Any]:
    if quick:
        return dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=256)
    return dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)


def llama_options(quick: bool) -> dict[str, Any]:
    if quick:
        sizes = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=352)
        heads = dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
        return dict(**sizes, **heads, max_position_embeddings=256)
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


def train_cases(quick: bool) -> dict[str, TrainCase]:
    gpt2 = "GPT-2-small (124M)" if not quick else "GPT-2, 2 x 128 (quick)"
    llama = "Llama-style 852M" if not quick else "Llama, 2 x 128 (quick)"
    return {
        "gpt2": TrainCase(
            "gpt2", gpt2, gpt2_options(quick), *((4, 64) if quick else (16, 1024))
        ),
        "llama": TrainCase(
            "llama", llama, llama_options(quick), *((2, 128) if quick else (4, 2048))
        ),
    }


def generate_case(quick: bool) -> GenerateCase:
    if quick:
        return GenerateCase(
            gpt2_options(True), prompt=8, new_tokens=16, batches=(1, 32)
        )
    return GenerateCase(gpt2_options(False), prompt=32, new_tokens=64, batches=(1, 32))


def peak_size(backend: str, quick: bool) -> int:
    """The side of the square bf16 matmul that measures the device's peak."""
    if backend == "cpu":
        return 512 if quick else 2048
    return 8192


def throughput_rows(
    figure: str, case: TrainCase, who: str, per_step: float, samples: list, extra: dict
) -> list[dict]:
    rate = [case.tokens / s for s in samples]
    return [
        row(figure, case.title, who, "step time", per_step * 1e3, "ms",
            samples=[s * 1e3 for s in samples], **extra),
        row(figure, case.title, who, "tokens/s", case.tokens / per_step, "tok/s",
            samples=rate, **extra),
    ]  # fmt: skip
