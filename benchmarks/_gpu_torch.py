"""`transformers` PyTorch's side of `benchmarks/gpu.py`, run inside a fresh
process (`_gpu_child.py`) on the same device as JAX's: the bf16 matmul peak, the
training step (eager, and `torch.compile` of the model), greedy generation
(eager). Every function returns result rows (`_timing.row`)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from _gpu_cases import GENERATE, TRAIN, GenerateCase, TrainCase, throughput_rows
from _gpu_timing import repeat, steady_time
from _timing import row

EAGER = "transformers eager"
COMPILED = "transformers torch.compile"


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def setup() -> dict:
    """PyTorch on as many threads as XLA's CPU client (the cores this process may
    use); returns what the header reports."""
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    info = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_threads": threads,
    }
    if torch.cuda.is_available():
        info["torch_device"] = torch.cuda.get_device_name(0)
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul_peak(size: int, reps: int) -> dict:
    a, b = (
        torch.randn(size, size, dtype=torch.bfloat16, device=device()) for _ in "ab"
    )

    def run() -> None:
        for i in range(10):
            _ = a @ (b + i)
        sync()

    run()
    return {"size": size, "tflops": 2 * size**3 / (repeat(run, reps) / 10) / 1e12}


def _model(case: TrainCase) -> Any:
    import transformers

    hf: Any = transformers
    torch.manual_seed(0)
    if case.name == "gpt2":
        model = hf.GPT2LMHeadModel(hf.GPT2Config(**case.options))
    else:
        model = hf.LlamaForCausalLM(hf.LlamaConfig(**case.options))
    return model.to(device=device(), dtype=torch.bfloat16).train()


def train(case: TrainCase, compiled: bool, reps: int, target_s: float) -> list[dict]:
    """The training step: `model(ids, labels=ids).loss`, backward, AdamW."""
    who = COMPILED if compiled else EAGER
    model = _model(case)
    forward = torch.compile(model) if compiled else model
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(
        0, case.options["vocab_size"], (case.batch, case.seq), generator=gen
    )
    ids = ids.to(device())
    last: list[Any] = [None]

    def run(n: int) -> None:
        for _ in range(n):
            loss = forward(input_ids=ids, labels=ids).loss
            loss.backward()
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
            last[0] = loss
        sync()

    try:
        start = time.perf_counter()
        run(1)
        first = time.perf_counter() - start
    except Exception as error:  # noqa: BLE001 - torch.compile may not run here
        why = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
        return [
            row(
                TRAIN, case.title, who, "tokens/s", None, "tok/s", note=f"failed: {why}"
            )
        ]
    attention = getattr(model.config, "_attn_implementation", "?")
    extra: dict[str, Any] = dict(attention=attention, tokens_per_step=case.tokens)
    metric = "first step, cold" if compiled else "first step (eager: no compile)"
    rows = [
        row(
            TRAIN,
            case.title,
            who,
            metric,
            first,
            "s",
            note=f"attention: {attention}",
            **extra,
        )
    ]
    per_step, samples = steady_time(run, reps, target_s)
    rows += throughput_rows(TRAIN, case, who, per_step, samples, extra)
    rows[-1]["final_loss"] = float(last[0])
    return rows


def generate(case: GenerateCase, directory: str, reps: int) -> list[dict]:
    """`transformers`' `generate(do_sample=False)` at each batch size: the first
    call in this fresh process, then warm times."""
    import transformers

    hf: Any = transformers
    model = hf.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.bfloat16)
    model = model.to(device()).eval()
    rows: list[dict] = []
    for batch in case.batches:
        prompt = np.random.RandomState(0).randint(
            0, model.config.vocab_size, (batch, case.prompt)
        )
        ids = torch.tensor(prompt, device=device())
        title = f"batch {batch}, {case.prompt} + {case.new_tokens} tokens"

        @torch.no_grad()
        def gen(n: int, ids: Any = ids) -> Any:
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                min_new_tokens=n, do_sample=False, pad_token_id=0,
            )  # fmt: skip
            sync()
            return out

        start = time.perf_counter()
        gen(1)
        first = time.perf_counter() - start
        out = gen(case.new_tokens)
        ttft = [_seconds(lambda: gen(1)) for _ in range(reps)]
        times = [_seconds(lambda: gen(case.new_tokens)) for _ in range(reps)]
        n = batch * case.new_tokens
        rows += [
            row(GENERATE, title, EAGER, "time to first token, fresh process, cold", first * 1e3, "ms"),
            row(GENERATE, title, EAGER, "tokens/s", n / float(np.median(times)), "tok/s",
                samples=[n / t for t in times], tokens=out[0, case.prompt :].tolist()),
            row(GENERATE, title, EAGER, "time to first token, warm",
                float(np.median(ttft)) * 1e3, "ms", samples=[t * 1e3 for t in ttft]),
        ]  # fmt: skip
    return rows


def _seconds(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
