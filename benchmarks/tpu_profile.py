"""What separates boxwood's GPT-2 (or Llama) training step from the hand-written
one, read from the compiled programs and a profile, in one process:

    python benchmarks/tpu_profile.py --out DIR          # GPT-2-small, 16 x 1024
    python benchmarks/tpu_profile.py --case llama --only boxwood,whole,jax --out DIR
                                                        # the 852M Llama, 4 x 2048
    python benchmarks/tpu_profile.py --quick --out DIR  # tiny sizes: checks the script

For each step (boxwood with `causal_lm_loss`, boxwood with the whole-logits loss,
the hand-written pure-JAX step, boxwood with dropout drawn by rbg and by
threefry, and, with `--only`, Flax NNX's step of `_acc_nnx.py` (the fastest peer
on the chip so far), boxwood's whole-logits step with its blocks unrolled, as
NNX's are, and boxwood's whole-logits step traced with `BOXWOOD_ON_ERROR=nan`
(`nocheck`: no token-id check, so no host callback in the program) it records the trace, lowering and compile times, XLA's cost analysis
(FLOPs, bytes accessed, transcendentals), `memory_analysis()`, the compiled
program's instructions by opcode (fusions, custom calls, copies, loops, random
bit generators), the median step time, and, from a `jax.profiler` trace of a
few steps, the device time by operation (the top operations and their kinds).
Writes `profile.json` and `profile.md` into `--out`. `--budget` seconds: steps
that would start past it are skipped.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import _acc_boxwood  # noqa: E402
import _acc_cases as cases  # noqa: E402
import _acc_jax  # noqa: E402
import boxwood as bw  # noqa: E402

# `--only` keys and the steps' names
CONTENDERS = {"boxwood": "boxwood", "whole": "boxwood, whole logits", "jax": "pure JAX",
              "rbg": "boxwood, dropout (rbg)", "threefry": "boxwood, dropout (threefry)",
              "nnx": "Flax NNX", "unrolled": "boxwood, whole logits, unrolled",
              "nocheck": "boxwood, whole logits, BOXWOOD_ON_ERROR=nan"}  # fmt: skip
REMAT = "dots_with_no_batch_dims_saveable"


def _step(who: str, case: cases.TrainCase, kind: str) -> tuple:
    """`(step, args, next_args)`: a jitted step, its first arguments, and how the
    arguments of the next step follow from an output."""
    optimiser = optax.adamw(**_acc_boxwood.OPTIMISER)
    ids = jax.random.randint(jax.random.key(1), (case.batch, case.seq), 0,
                             case.options["vocab_size"])  # fmt: skip
    if who == "Flax NNX":  # its step updates model and optimiser in place
        if case.name != "gpt2":
            raise ValueError("Flax NNX's step is written for GPT-2 only")
        import _acc_nnx

        model = _acc_nnx.build(case.options, kind, REMAT, jnp.bfloat16)
        step, nnx_optimiser = _acc_nnx.trainer(model)
        return step, (model, nnx_optimiser, ids), lambda out, a: a
    if who == "pure JAX":
        params = _acc_jax.INITS[case.name](
            case.options, jax.random.key(0), jnp.bfloat16
        )
        step = _acc_jax.train_step(case.name, case.options, kind, REMAT, optimiser)
        return (
            step,
            (ids, params, optimiser.init(params)),
            lambda out, a: (ids, out[0], out[1]),
        )
    dropout = {
        "boxwood, dropout (rbg)": "rbg",
        "boxwood, dropout (threefry)": "threefry",
    }.get(who)
    loss = "whole" if who.startswith("boxwood, whole logits") else "chunked"
    unroll = True if who.endswith("unrolled") else 1  # no scan over the blocks
    bw.nn.set_dropout_generator(dropout or "auto")
    model = _acc_boxwood.prepared(case.name, case.options, kind, REMAT, jnp.bfloat16,
                                  unroll=unroll, dropout=dropout is not None)  # fmt: skip
    state = optimiser.init(bw.filter(model, bw.is_inexact_array))
    step = _acc_boxwood.step_function(optimiser, loss)
    base, count = jax.random.key(5), [0]

    def key() -> Any:  # a new key each step (the step donates the one it gets)
        count[0] += 1
        return None if dropout is None else jax.random.fold_in(base, count[0])

    def following(out: Any, args: tuple) -> tuple:
        return (ids, out[0], out[1], key())

    return step, (ids, model, state, key()), following


def _opcodes(text: str) -> dict[str, int]:
    """The compiled program's instructions by opcode (`%x = type opcode(...)`)."""
    counts: collections.Counter = collections.Counter()
    for m in re.finditer(r"=\s+[^=]*?\s([a-z][a-z0-9\-]*)\(", text):
        counts[m.group(1)] += 1
    keep = ("fusion", "custom-call", "copy", "while", "rng-bit-generator", "convolution",
            "dot", "all-reduce", "transpose", "convert", "dynamic-slice",
            "dynamic-update-slice", "rng", "call", "conditional")  # fmt: skip
    return {k: counts[k] for k in keep if counts[k]}


def _kind(name: str) -> str:
    """The kind of an operation from its instruction's name (`%copy-start.3`,
    `%fusion.12`): the event's text after ` = ` holds its operands' names, and a
    fusion reading a `%copy-done` is a fusion."""
    n = name.split(" = ", 1)[0].lower()
    for word, kind in (("splash", "attention kernel"), ("custom-call", "custom call"),
                       ("convolution", "matmul"), ("dot", "matmul"), ("rng", "random bits"),
                       ("threefry", "random bits"), ("copy", "copy"), ("fusion", "fusion"),
                       ("while", "loop"), ("all-reduce", "collective")):  # fmt: skip
        if word in n:
            return kind
    return "other"


def _device_profile(run: Any, steps: int) -> dict:
    """Device time by operation over `steps` steps, from a `jax.profiler` trace."""
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        run(steps)
        jax.profiler.stop_trace()
        files = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
        if not files:
            return {"error": "no trace written"}
        data = ProfileData.from_file(files[0])
    by_op: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    planes = []
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        planes.append(plane.name)
        for line in plane.lines:
            if line.name not in ("XLA Ops", "TPU XLA Ops"):
                continue
            for event in line.events:
                ms = event.duration_ns / 1e6 / steps
                by_op[event.name] += ms
                by_kind[_kind(event.name)] += ms
        break  # one device
    if not planes:
        return {"error": "no device plane (a CPU run)"}
    return {"plane": planes[0], "ms_per_step_by_kind": dict(by_kind.most_common()),
            "top_ops_ms_per_step": dict(by_op.most_common(25)),
            "total_ms_per_step": sum(by_kind.values())}  # fmt: skip


def measure(who: str, case: cases.TrainCase, kind: str, reps: int) -> dict:
    """`_measure`, with `BOXWOOD_ON_ERROR=nan` for the whole of a contender that
    asks for it (each check reads it as it is traced, at lowering or at a call)."""
    if not who.endswith("BOXWOOD_ON_ERROR=nan"):
        return _measure(who, case, kind, reps)
    before = os.environ.get("BOXWOOD_ON_ERROR")
    os.environ["BOXWOOD_ON_ERROR"] = "nan"
    try:
        return _measure(who, case, kind, reps)
    finally:
        if before is None:
            os.environ.pop("BOXWOOD_ON_ERROR", None)
        else:
            os.environ["BOXWOOD_ON_ERROR"] = before


def _measure(who: str, case: cases.TrainCase, kind: str, reps: int) -> dict:
    step, args, following = _step(who, case, kind)
    start = time.perf_counter()
    lowered = step.lower(*args)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    row: dict[str, Any] = {
        "contender": who, "trace_and_lower_s": lower_s, "compile_s": compile_s,
        "flops": cost.get("flops"), "bytes_accessed": cost.get("bytes accessed"),
        "transcendentals": cost.get("transcendentals"),
        "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
        "opcodes": _opcodes(text), "hlo_lines": text.count("\n"),
    }  # fmt: skip
    carry = [args]

    def run(n: int) -> Any:
        out = None
        for _ in range(n):
            out = step(*carry[0])
            carry[0] = following(out, carry[0])
        return jax.block_until_ready(out)

    start = time.perf_counter()
    run(1)
    row["first_call_s"] = time.perf_counter() - start
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run(3)
        times.append((time.perf_counter() - start) / 3)
    row["step_ms"] = 1e3 * statistics.median(times)
    row["tokens_per_s"] = case.tokens / statistics.median(times)
    row["profile"] = _device_profile(run, 3)
    carry.clear()
    del compiled, lowered
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Training step profile ({meta['device']}, {meta['label']})", "",
             "| step | step ms | tokens/s | trace+lower s | compile s | TFLOP | GB accessed | fusions | custom calls | copies | rng |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['contender']} | FAILED: {r['error']} |")
            continue
        o = r["opcodes"]
        lines.append(
            f"| {r['contender']} | {r['step_ms']:.2f} | {r['tokens_per_s']:,.0f} | "
            f"{r['trace_and_lower_s']:.2f} | {r['compile_s']:.2f} | "
            f"{(r['flops'] or 0) / 1e12:.3f} | {(r['bytes_accessed'] or 0) / 1e9:.2f} | "
            f"{o.get('fusion', 0)} | {o.get('custom-call', 0)} | {o.get('copy', 0)} | "
            f"{o.get('rng-bit-generator', 0) + o.get('rng', 0)} |"
        )
    for r in rows:
        p = r.get("profile") or {}
        if "ms_per_step_by_kind" not in p:
            continue
        lines += ["", f"## {r['contender']}: device ms per step by kind "
                  f"({p['total_ms_per_step']:.2f} ms in all)", ""]  # fmt: skip
        lines += [f"- {k}: {v:.2f}" for k, v in p["ms_per_step_by_kind"].items()]
        lines += ["", "top operations (ms per step):", ""]
        lines += [
            f"- `{k}`: {v:.3f}" for k, v in list(p["top_ops_ms_per_step"].items())[:15]
        ]
    return "\n".join(lines) + "\n"


def write_results(out: Path, stem: str, meta: dict, rows: list, markdown: Any) -> None:
    """`stem.json` (the meta and rows) and `stem.md` (`markdown(rows, meta)`) in
    `out`, written again after each row, so that a run cut short keeps its rows."""
    (out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1, default=str)
    )
    (out / f"{stem}.md").write_text(markdown(rows, meta))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--budget", type=float, default=1e9)
    p.add_argument("--case", default="gpt2", choices=("gpt2", "llama"),
                   help="the model (Flax NNX's step is GPT-2's only)")  # fmt: skip
    p.add_argument(
        "--only",
        default="boxwood,whole,jax,rbg,threefry",
        help="of " + ",".join(CONTENDERS),
    )
    args = p.parse_args()
    started = time.monotonic()
    case = cases.train_cases(args.quick)[args.case]
    kind = "splash" if jax.default_backend() == "tpu" else "xla"
    meta = {"device": jax.devices()[0].device_kind, "label": case.label, "attention": kind,
            "remat": REMAT, "jax": jax.__version__}  # fmt: skip
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for who in (CONTENDERS[k] for k in args.only.split(",")):
        if time.monotonic() - started > args.budget:
            rows.append({"contender": who, "error": "skipped: budget spent"})
            continue
        print(f"[tpu_profile] {who}", file=sys.stderr, flush=True)
        try:
            rows.append(measure(who, case, kind, args.reps))
        except Exception as error:  # noqa: BLE001 - one failed step, reported
            rows.append(
                {
                    "contender": who,
                    "error": f"{type(error).__name__}: {str(error)[:300]}",
                }
            )
        write_results(args.out, "profile", meta, rows, markdown)
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
