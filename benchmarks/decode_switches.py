"""boxwood's `generate` with each of its decoding-step switches on and off, side
by side in one process (GPT-2-small in bf16, greedy, 128 new tokens after a
32-token prompt, batch 1 and 32, as tpu_generate_profile.py runs it):

- `_attend.DECODE_ATTENTION`: one new token attends over the cache with two
  plain products in the cache's layout ("einsum") or through
  `jax.nn.dot_product_attention` ("fused");
- `_blocks.GROUP_HEADS`: the loop's cache holds heads side by side in 128-lane
  rows ("always"; "auto" does so on a TPU over several rows) or one head to a
  row ("never");
- `_generate_loop.ROWS_APART`: the most rows for which the loop takes each
  layer's weights sliced from the stack once, before it (1: one row only, as
  by default; 32: the batch too).

For each combination ("today": all off; the plain products alone; with the
grouped cache; with the layers apart over the batch too; the modules'
defaults, where they differ from all of those) and batch it records the median
of `--reps` whole calls and of `--reps` one-token calls (after a warm-up call
each), the step `(T(new) - T(1)) / (new - 1)` and tokens/s, and whether the
tokens equal today's. In bf16 products summed in another order may pick
another token where two are close, so on the full sizes that is reported, not
checked; `--quick` (a check of the script, and of the switches, on a CPU) runs
the tiny model in float32, batch 1 and 8, where unequal tokens fail the run
(exit 1). `--only today,grouped` and `--batches 32` run fewer.

    python benchmarks/decode_switches.py --out DIR           # GPT-2-small
    python benchmarks/decode_switches.py --quick --out DIR   # tiny: a CPU check

Writes `decode_switches.json` and `decode_switches.md` into `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _acc_boxwood  # noqa: E402
import _acc_cases as cases  # noqa: E402
import boxwood as bw  # noqa: E402
import boxwood.models as bm  # noqa: E402
from boxwood.models import _attend, _blocks, _generate, _generate_loop  # noqa: E402
from tpu_profile import write_results  # noqa: E402

# name: (DECODE_ATTENTION, GROUP_HEADS, ROWS_APART); "defaults" is filled
# in from the modules as imported
COMBINATIONS: dict[str, tuple[str, str, int]] = {
    "today": ("fused", "never", 1),
    "einsum": ("einsum", "never", 1),
    "grouped": ("einsum", "always", 1),
    "apart": ("einsum", "always", 64),
}


def _switch(attention: str, group: str, apart: int) -> None:
    """Set the switches; the compiled loops are dropped, so the next call traces
    with them."""
    _attend.DECODE_ATTENTION = attention
    _blocks.GROUP_HEADS = group
    _generate_loop.ROWS_APART = apart
    _generate._decode.clear_cache()


def _median_call(model: Any, ids: Any, new: int, reps: int) -> tuple[float, Any]:
    tokens = np.asarray(bm.generate(model, ids, new))  # compile and warm
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.asarray(bm.generate(model, ids, new))
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def measure(model: Any, case: Any, batch: int, reps: int) -> Iterator[dict]:
    """Each combination's row at `batch`, as it is measured."""
    vocab = case.options["vocab_size"]
    prompt = np.random.RandomState(0).randint(0, vocab, (batch, case.prompt))
    ids = jnp.asarray(prompt.astype(np.int32))
    new = case.new_tokens
    today = None
    for name, switches in combinations().items():
        _switch(*switches)
        whole, tokens = _median_call(model, ids, new, reps)
        one, _ = _median_call(model, ids, 1, reps)
        today = tokens if today is None else today
        step = (whole - one) / (new - 1)
        row = {
            "combination": name, "batch": batch,
            "decode_attention": switches[0], "group_heads": switches[1],
            "rows_apart": switches[2],
            "call_s": whole, "one_token_call_s": one, "step_ms": 1e3 * step,
            "tokens_per_s": batch * new / whole,
            "steady_tokens_per_s": batch / step if step > 0 else None,
            "same_tokens_as_today": bool(np.array_equal(tokens, today)),
        }  # fmt: skip
        print(row, file=sys.stderr, flush=True)
        yield row
    _switch(*DEFAULTS)


# the switches as the modules set them
DEFAULTS = (
    _attend.DECODE_ATTENTION,
    _blocks.GROUP_HEADS,
    _generate_loop.ROWS_APART,
)


def combinations() -> dict[str, tuple[str, str, bool]]:
    """`COMBINATIONS`, and "defaults" where the defaults on this backend are
    none of them ("auto" read as the backend reads it)."""
    on_tpu = jax.default_backend() == "tpu"
    resolved = (
        ("einsum" if on_tpu else "fused") if DEFAULTS[0] == "auto" else DEFAULTS[0],
        ("always" if on_tpu else "never") if DEFAULTS[1] == "auto" else DEFAULTS[1],
        DEFAULTS[2],
    )
    if resolved in COMBINATIONS.values():
        return COMBINATIONS
    return {**COMBINATIONS, "defaults": DEFAULTS}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# `generate`'s decoding switches ({meta['device']}, GPT-2 {meta['label']})",
        "",
        f"JAX {meta['jax']}; load average {meta['load_average']}; "
        f"{meta['new_tokens']} new tokens after a {meta['prompt']}-token prompt, greedy; "
        f"median of {meta['reps']} calls. Step: `(T(new) - T(1)) / (new - 1)`.",
        "",
        "| batch | combination | DECODE_ATTENTION | GROUP_HEADS | ROWS_APART "
        "| call ms | step ms | step / first row's | tokens/s | steady tokens/s | tokens as the first row's |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    # the ratio to the batch's first row ("today" unless `--only` leaves it out)
    today: dict[int, float] = {}
    for r in rows:
        today.setdefault(r["batch"], r["step_ms"])
    for r in rows:
        steady = r["steady_tokens_per_s"]
        ratio = r["step_ms"] / today[r["batch"]] if today[r["batch"]] > 0 else 0.0
        lines.append(
            f"| {r['batch']} | {r['combination']} | {r['decode_attention']} | "
            f"{r['group_heads']} | {r['rows_apart']} | {1e3 * r['call_s']:.2f} | "
            f"{r['step_ms']:.3f} | {ratio:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{'-' if steady is None else f'{steady:,.0f}'} | {r['same_tokens_as_today']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="7, or 1 with --quick")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--only", default="", help="combinations, comma-separated (all)")
    p.add_argument("--batches", default="", help="batches, comma-separated (1,32)")
    args = p.parse_args()
    if args.only:
        wanted = args.only.split(",")
        for name in [n for n in COMBINATIONS if n not in wanted]:
            del COMBINATIONS[name]
    reps = args.reps or (1 if args.quick else 7)
    case = cases.generate_case(args.quick)
    if args.quick:  # a check of the script: batch 32 of the tiny model is slow here
        case = dataclasses.replace(case, batches=(1, 8))
    if args.batches:
        batches = tuple(map(int, args.batches.split(",")))
        case = dataclasses.replace(case, batches=batches)
    model = _acc_boxwood.generation_model(case.options)
    if args.quick:
        model = bw.cast_floating(model, jnp.float32)
    meta = {
        "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
        "label": "tiny, float32" if args.quick else "small, bf16", "jax": jax.__version__,
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "prompt": case.prompt, "new_tokens": case.new_tokens, "reps": reps,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for batch in case.batches:
        for row in measure(model, case, batch, reps):  # written row by row
            rows.append(row)
            write_results(args.out, "decode_switches", meta, rows, markdown)
    print(markdown(rows, meta))
    if args.quick and not all(r["same_tokens_as_today"] for r in rows):
        print("float32: a combination's tokens differ from today's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
