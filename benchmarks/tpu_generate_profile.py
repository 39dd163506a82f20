"""What bounds greedy generation on the device: boxwood's `generate` beside the
hand-written loop (`_acc_jax.gpt2_generate`), in one process:

    python benchmarks/tpu_generate_profile.py --out DIR           # GPT-2-small
    python benchmarks/tpu_generate_profile.py --quick --out DIR   # tiny: checks the script

For each contender and batch (1 and 32; 128 new tokens after a 32-token prompt)
it records the median wall time of a whole call, the same with one new token
(so that the per-token cost is `(T(new) - T(1)) / (new - 1)` and the fixed cost
of a call is apart from it), and, from a `jax.profiler` trace of one call, the
device time by operation: the busy device time against the wall time says
how much of a call the host keeps the device waiting, and the top operations
say which part of a step takes the time. The bound is the weights' bytes over
the device's bandwidth, measured in the same run (a reduction over 1 GiB).
Writes `generate_profile.json` and `generate_profile.md` into `--out`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _acc_boxwood  # noqa: E402
import _acc_cases as cases  # noqa: E402
import _acc_jax  # noqa: E402
from tpu_profile import _device_profile, write_results  # noqa: E402


def bandwidth(quick: bool) -> float:
    """Bytes a second of a reduction over a 1 GiB bf16 array, 10 calls queued
    per timing (as accelerator.py's device figure; median of 5)."""
    n = (1 << 20) if quick else (1 << 29)
    x = jnp.zeros((n,), jnp.bfloat16)
    total = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    total(x).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        out = [total(x) for _ in range(10)]
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / 10)
    return 2 * n / statistics.median(times)


def _median_call(fn: Any, ids: Any, reps: int) -> float:
    np.asarray(fn(ids))  # compile and warm
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.asarray(fn(ids))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _busy(profile: dict) -> float | None:
    """Device ms per call outside loops' own events (a loop's event spans the
    operations inside it, which have their own)."""
    if "total_ms_per_step" not in profile:
        return None
    return profile["total_ms_per_step"] - profile["ms_per_step_by_kind"].get(
        "loop", 0.0
    )


def measure(
    who: str, model: Any, params: Any, case: Any, batch: int, reps: int
) -> dict:
    if who == "boxwood":

        def call(new: int) -> Any:
            return lambda ids: _acc_boxwood.generate(model, ids, new)
    else:

        def call(new: int) -> Any:
            return lambda ids: _acc_jax.gpt2_generate(params, ids, new, case.options)

    vocab = case.options["vocab_size"]
    prompt = np.random.RandomState(0).randint(0, vocab, (batch, case.prompt))
    ids = jnp.asarray(prompt.astype(np.int32))
    new = case.new_tokens
    whole = _median_call(call(new), ids, reps)
    one = _median_call(call(1), ids, reps)
    per_token = (whole - one) / (new - 1)
    fn = call(new)
    profile = _device_profile(lambda n: [np.asarray(fn(ids)) for _ in range(n)], 2)
    short = call(1)
    one_profile = _device_profile(
        lambda n: [np.asarray(short(ids)) for _ in range(n)], 4
    )
    return {
        "contender": who, "batch": batch, "call_s": whole, "one_token_call_s": one,
        "per_step_ms": 1e3 * per_token, "tokens_per_s": batch * new / whole,
        "steady_tokens_per_s": batch / per_token if per_token > 0 else None,
        "profile": profile,
        "one_token_device_ms": _busy(one_profile),
        "one_token_top_ops": dict(list(one_profile.get("top_ops_ms_per_step", {}).items())[:8]),
    }  # fmt: skip


def markdown(rows: list[dict], meta: dict) -> str:
    bound = meta["bound_step_ms"]
    lines = [
        f"# Greedy generation profile ({meta['device']}, GPT-2 {meta['label']})", "",
        f"Bandwidth {meta['bandwidth_gb_s']:.0f} GB/s; the weights ({meta['param_mb']:.0f} MB) "
        f"read once a step bound a step at {bound:.3f} ms.", "",
        "| contender | batch | call ms | 1-token call ms | its device ms | step ms | step / bound | tokens/s | device busy ms per call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['contender']} | {r.get('batch')} | FAILED: {r['error']} |"
            )
            continue
        busy = _busy(r.get("profile") or {})
        lines.append(
            f"| {r['contender']} | {r['batch']} | {1e3 * r['call_s']:.2f} | "
            f"{1e3 * r['one_token_call_s']:.2f} | {r.get('one_token_device_ms') or 0:.2f} | "
            f"{r['per_step_ms']:.3f} | "
            f"{r['per_step_ms'] / bound:.2f} | {r['tokens_per_s']:,.0f} | "
            f"{'-' if busy is None else f'{busy:.2f}'} |"
        )
    for r in rows:
        p = r.get("profile") or {}
        if "ms_per_step_by_kind" not in p:
            continue
        lines += [
            "",
            f"## {r['contender']}, batch {r['batch']}: device ms per call by kind",
            "",
        ]
        lines += [f"- {k}: {v:.3f}" for k, v in p["ms_per_step_by_kind"].items()]
        lines += ["", "top operations (ms per call):", ""]
        lines += [
            f"- `{k}`: {v:.3f}" for k, v in list(p["top_ops_ms_per_step"].items())[:20]
        ]
    return "\n".join(lines) + "\n"


def hlo_lines(case: Any, model: Any, batch: int) -> list[str]:
    """The compiled decoding loop of `generate` at `batch` (on the device), its
    custom calls and copies, one line each: what a step does besides the model's
    arithmetic."""
    import boxwood as bw
    from boxwood.models import _generate
    from boxwood.models._generate_loop import decode_loop

    called: dict = {}
    original = _generate._decode

    def spy(*args: Any) -> Any:
        called["args"] = args
        return original(*args)

    _generate._decode = spy
    try:
        prompt = np.zeros((batch, case.prompt), np.int32)
        _acc_boxwood.generate(model, jnp.asarray(prompt), 2)
    finally:
        _generate._decode = original
    text = bw.filter_jit(decode_loop).lower(*called["args"]).compile().as_text()
    return [
        line.strip()[:400]
        for line in text.splitlines()
        if " custom-call(" in line or " copy(" in line or "copy-start" in line
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--only", default="boxwood,pure JAX")
    p.add_argument("--hlo", action="store_true",
                   help="only write decode_hlo.txt: the custom calls and copies of "
                   "the compiled loop at the largest batch")  # fmt: skip
    args = p.parse_args()
    case = cases.generate_case(args.quick)
    model = _acc_boxwood.generation_model(case.options)
    if args.hlo:
        args.out.mkdir(parents=True, exist_ok=True)
        lines = hlo_lines(case, model, max(case.batches))
        (args.out / "decode_hlo.txt").write_text("\n".join(lines) + "\n")
        print(f"{len(lines)} custom calls and copies", file=sys.stderr)
        return 0
    params = _acc_jax.from_boxwood_gpt2(model)
    bw_bytes = bandwidth(args.quick)
    meta = {"device": jax.devices()[0].device_kind, "label": case.label(0),
            "bandwidth_gb_s": bw_bytes / 1e9, "param_mb": case.param_bytes / 1e6,
            "bound_step_ms": 1e3 * case.param_bytes / bw_bytes, "jax": jax.__version__}  # fmt: skip
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for who in args.only.split(","):
        for batch in case.batches:
            print(
                f"[tpu_generate_profile] {who}, batch {batch}",
                file=sys.stderr,
                flush=True,
            )
            try:
                rows.append(measure(who, model, params, case, batch, args.reps))
            except Exception as error:  # noqa: BLE001 - one failed figure, reported
                rows.append({"contender": who, "batch": batch,
                             "error": f"{type(error).__name__}: {str(error)[:300]}"})  # fmt: skip
            write_results(args.out, "generate_profile", meta, rows, markdown)
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
