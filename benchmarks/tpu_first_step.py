"""The first step and the steady step of GPT-2's training step, side by side in
one process: boxwood with dropout off, boxwood with the config's dropout (0.1
on the embeddings and the residual branches; masks from `rbg`, the default on
a TPU), and the hand-written pure-JAX program of `_acc_jax.py`:

    python benchmarks/tpu_first_step.py --out DIR          # GPT-2-small, 16 x 1024
    python benchmarks/tpu_first_step.py --quick --out DIR  # tiny sizes (a CPU check)

For each step: the first call's wall time, split into JAX's trace, lowering and
XLA compile (from `jax.monitoring`) and the programs compiled during it (a key
made eagerly outside the step would be one more); the lowered program's size
(StableHLO lines, threefry hashes, `rng_bit_generator` draws); the median
steady step. The dropout step makes its key inside the program
(`fold_in(key, step)` of a step counter passed as a NumPy scalar), so that
its first call compiles the step alone. bf16 parameters, AdamW, remat
`dots_with_no_batch_dims_saveable`, splash attention on a TPU (XLA's
elsewhere), `causal_lm_loss` for boxwood and the whole-logits float32 loss for
the hand-written step, as in `accelerator.py`.

`--order` gives the order of the contenders (the first pays for JAX's own
warm-up in the process; `--warm` first compiles a one-layer step of the same
widths and sequence length to take that out). `--fresh ROUNDS` runs each
contender in a process of its own instead (the parent starts no backend), the
order reversed every other round, and reports the medians: a user's first step,
with nothing compiled before it. `--cache DIR` turns on JAX's persistent compilation cache in
DIR: a second run with the same DIR measures first steps from the cache
(a program holding a host callback, such as boxwood's id checks, is never
cached by JAX; the column "host callbacks" counts them). `--profile` writes a
`cProfile` of each first step (what its trace and lowering spend time on) into
`--out`, with `--fresh` from one more process per contender after the timed
ones. Writes `first_step.json` and `first_step.md` into `--out`
after each contender (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import _acc_boxwood  # noqa: E402
import _acc_cases as cases  # noqa: E402
import _acc_jax  # noqa: E402
import boxwood as bw  # noqa: E402
import boxwood.models as bm  # noqa: E402
from _acc_timing import Compiles, steady_time  # noqa: E402

REMAT = "dots_with_no_batch_dims_saveable"
CONTENDERS = {
    "none": "boxwood, dropout 0",
    "rbg": "boxwood, dropout 0.1 (rbg)",
    "threefry": "boxwood, dropout 0.1 (threefry)",
    "jax": "hand-written pure JAX",
}


def _boxwood(case: cases.TrainCase, kind: str, dropout: str | None) -> tuple:
    """`(run, lower)` of boxwood's step: `run(n)` takes `n` steps, `lower()`
    lowers it (JAX's `Lowered`, or boxwood's around it)."""
    if dropout is not None:
        bw.nn.set_dropout_generator(dropout)
    model = _acc_boxwood.prepared(case.name, case.options, kind, REMAT, jnp.bfloat16,
                                  dropout=dropout is not None)  # fmt: skip
    optimiser = optax.adamw(**_acc_boxwood.OPTIMISER)
    state = optimiser.init(bw.filter(model, bw.is_inexact_array))
    value_and_grad = bw.filter_value_and_grad(bm.causal_lm_loss)

    @bw.filter_jit(donate="all-except-first")
    def step(data: tuple, model: Any, state: Any) -> tuple:
        ids, base, count = data
        # the step's dropout key, made in the program: nothing runs outside it
        key = None if base is None else jax.random.fold_in(base, count)
        loss, grads = value_and_grad(model, ids, key=key)
        params = bw.filter(model, bw.is_inexact_array)
        updates, state = optimiser.update(grads, state, params)
        return bw.apply_updates(model, updates), state, loss

    ids = _ids(case)
    base = None if dropout is None else jax.random.key(5)
    carry: list[Any] = [model, state, None]
    jax.block_until_ready((ids, carry[:2], base))
    count = [0]

    def run(n: int) -> Any:
        for _ in range(n):
            count[0] += 1
            data = (ids, base, np.asarray(count[0], np.int32))
            carry[0], carry[1], carry[2] = step(data, carry[0], carry[1])
        return jax.block_until_ready(carry[2])

    def lowered() -> Any:
        return step.lower((ids, base, np.asarray(0, np.int32)), carry[0], carry[1])

    return run, lowered


def _jax(case: cases.TrainCase, kind: str) -> tuple:
    optimiser = optax.adamw(**_acc_boxwood.OPTIMISER)
    params = _acc_jax.INITS[case.name](case.options, jax.random.key(0), jnp.bfloat16)
    state = optimiser.init(params)
    step = _acc_jax.train_step(case.name, case.options, kind, REMAT, optimiser)
    ids = _ids(case)
    carry: list[Any] = [params, state, None]
    jax.block_until_ready((ids, carry[:2]))

    def run(n: int) -> Any:
        for _ in range(n):
            carry[0], carry[1], carry[2] = step(ids, carry[0], carry[1])
        return jax.block_until_ready(carry[2])

    def lowered() -> Any:
        return step.lower(ids, carry[0], carry[1])

    return run, lowered


def _ids(case: cases.TrainCase) -> jax.Array:
    rows = np.random.RandomState(1).randint(
        0, case.options["vocab_size"], (case.batch, case.seq)
    )
    return jnp.asarray(rows, jnp.int32)


def _warm_up(case: cases.TrainCase, kind: str) -> None:
    """A one-layer hand-written GPT-2 step of the case's widths and sequence
    length, batch 2, traced, compiled and run: JAX's own first-use costs (its
    jitted helpers, the backend) and whatever every contender builds alike for
    these shapes (the attention kernels) then fall on no contender. On a TPU
    v5e, with a warm-up step of another size, whichever contender came first
    took 3-4 s more than it did later in the process (three programs compiled
    against one)."""
    small = cases.TrainCase(
        "gpt2", "warm-up", case.options | dict(n_layer=1), 2, case.seq
    )
    run, _ = _jax(small, kind)
    run(1)


def _host_callbacks(program: Any, text: str) -> int:
    """The host callbacks JAX compiles with `program` (what keeps a program out
    of its persistent cache); from the text where JAX's lowering is not at hand
    (on the CPU a callback is a custom call; on a TPU, sends and receives)."""
    lowering = getattr(program, "_lowering", None)
    found = getattr(lowering, "compile_args", {}).get("host_callbacks")
    if found is not None:
        return len(found)
    return len(re.findall(r"custom_call @\w*callback", text))


def _profiled(key: str, out: Path | None, first: Any) -> Any:
    """`first()`, under `cProfile` when `out` is given: the 60 functions of the
    most cumulative time into `out/profile-<key>.txt` (the timing then includes
    the profiler's overhead)."""
    if out is None:
        return first()
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    result = profile.runcall(first)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
    (out / f"profile-{key}.txt").write_text(text.getvalue())
    return result


def measure(
    key: str,
    case: cases.TrainCase,
    kind: str,
    reps: int,
    target: float,
    profile: Path | None = None,
) -> dict:
    started = time.perf_counter()
    if key == "jax":
        run, lower = _jax(case, kind)
    else:
        run, lower = _boxwood(case, kind, None if key == "none" else key)
    build_s = time.perf_counter() - started
    with Compiles() as compiles:
        start = time.perf_counter()
        loss = float(_profiled(key, profile, lambda: run(1)))
        first = time.perf_counter() - start
    t = compiles.totals
    program = lower()
    lowered = program.as_text()
    per_step, samples = steady_time(run, reps, target)
    return {
        "contender": CONTENDERS[key], "key": key, "build_s": build_s,
        "first_step_s": first, "trace_s": t["trace"], "lower_s": t["lower"],
        "compile_s": t["compile"], "programs": int(t["programs"]),
        "cache_hits": int(t["cache_hits"]), "cache_misses": int(t["cache_misses"]),
        "stablehlo_lines": lowered.count("\n"),
        "threefry_calls": len(re.findall(r"call @_?threefry", lowered)),
        "rng_bit_generator": lowered.count("rng_bit_generator"),
        "host_callbacks": _host_callbacks(program, lowered),
        "step_ms": per_step * 1e3, "step_samples_ms": [s * 1e3 for s in samples],
        "tokens_per_s": case.tokens / per_step, "first_loss": loss,
    }  # fmt: skip


NUMBERS = ("build_s", "first_step_s", "trace_s", "lower_s", "compile_s", "programs",
           "step_ms", "tokens_per_s")  # fmt: skip


def fresh_rounds(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`--fresh ROUNDS`: each contender's first step in a process of its own
    (where nothing else has compiled, as a user's first step is), the order
    reversed every other round; the medians per contender, each run's first
    step beside them."""
    order = [k for k in args.order.split(",") if k]
    unknown = [k for k in order if k not in CONTENDERS]
    if unknown:
        parser.error(f"--order: unknown {unknown}; choose from {', '.join(CONTENDERS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {k: [] for k in order}
    meta: dict[str, Any] = {}
    for round_ in range(args.fresh):
        for key in order if round_ % 2 == 0 else order[::-1]:
            child_out = args.out / f"round{round_ + 1}-{key}"
            command = [sys.executable, __file__, "--order", key, "--out", str(child_out),
                       "--reps", str(args.reps), "--target", str(args.target)]  # fmt: skip
            command += ["--warm"] * args.warm + ["--quick"] * args.quick
            print(f"[tpu_first_step] round {round_ + 1}: {CONTENDERS[key]}",
                  file=sys.stderr, flush=True)  # fmt: skip
            try:
                subprocess.run(command, timeout=args.child_timeout, check=False,
                               stdout=subprocess.DEVNULL)  # fmt: skip
                found = json.loads((child_out / "first_step.json").read_text())
                meta = meta or found["meta"]
                runs[key] += found["rows"]
            except (subprocess.TimeoutExpired, OSError, ValueError) as error:
                runs[key].append({"contender": CONTENDERS[key], "key": key,
                                  "error": f"{type(error).__name__}: {error}"[:300]})  # fmt: skip
            rows = [_median_row(key, r) for key, r in runs.items() if r]
            meta_now = meta | {"order": f"{','.join(order)}, reversed every other round",
                               "fresh": args.fresh, "runs": {k: [r.get("first_step_s") for r in v] for k, v in runs.items()}}  # fmt: skip
            (args.out / "first_step.json").write_text(
                json.dumps({"meta": meta_now, "rows": rows, "runs": runs}, indent=1, default=str)
            )  # fmt: skip
            (args.out / "first_step.md").write_text(markdown(rows, meta_now))
    if args.profile:  # one more process each, profiled: not among the figures
        for key in order:
            child_out = args.out / f"profiled-{key}"
            command = [sys.executable, __file__, "--order", key, "--out", str(child_out),
                       "--reps", "1", "--target", "0", "--profile"]  # fmt: skip
            command += ["--warm"] * args.warm + ["--quick"] * args.quick
            print(
                f"[tpu_first_step] profiled: {CONTENDERS[key]}",
                file=sys.stderr,
                flush=True,
            )
            try:
                subprocess.run(command, timeout=args.child_timeout, check=False,
                               stdout=subprocess.DEVNULL)  # fmt: skip
            except (subprocess.TimeoutExpired, OSError) as error:
                print(f"[tpu_first_step] profiled {key}: {error}", file=sys.stderr)
    print((args.out / "first_step.md").read_text())
    return 0


def _median_row(key: str, runs: list[dict]) -> dict:
    """The medians of `runs` (one contender's rows, failed ones left out), with
    the last run's program text counts; an error row if none succeeded."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[-1]
    row = dict(good[-1])
    for field in NUMBERS:
        row[field] = float(np.median([r[field] for r in good]))
    row["runs"] = len(good)
    return row


def _fresh_note(meta: dict) -> str:
    if not meta.get("fresh"):
        return ""
    each = "; ".join(
        f"{CONTENDERS[k]} {', '.join('-' if t is None else f'{t:.2f}' for t in times)}"
        for k, times in meta["runs"].items()
    )
    return (f"; each contender in a fresh process, {meta['fresh']} rounds, medians "
            f"(first steps, s: {each})")  # fmt: skip


def _ratio(rows: dict, a: str, b: str, field: str) -> str:
    if a in rows and b in rows and rows[b].get(field):
        return f"{rows[a][field] / rows[b][field]:.3f}x"
    return "n/a"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# First step and steady step, GPT-2 ({meta['device']}, {meta['label']})", "",
        f"JAX {meta['jax']}, attention `{meta['attention']}`, remat `{REMAT}`, bf16 "
        f"parameters, AdamW; load average {meta['load']}; persistent cache: "
        f"{meta['cache'] or 'off'}; BOXWOOD_ON_ERROR {meta['on_error'] or 'unset'}; "
        f"order {meta['order']}"
        f"{', after a warm-up step' if meta['warm'] is True else ''}"
        f"{'; warm-up ' + meta['warm'] if isinstance(meta['warm'], str) else ''}"
        f"{_fresh_note(meta)}.", "",
        "| step | first step s | trace s | lower s | XLA compile s | programs | "
        "StableHLO lines | threefry calls | RBG draws | host callbacks | step ms | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['contender']} | FAILED: {r['error']} |")
            continue
        lines.append(
            f"| {r['contender']} | {r['first_step_s']:.2f} | {r['trace_s']:.2f} | "
            f"{r['lower_s']:.2f} | {r['compile_s']:.2f} | {r['programs']:g} | "
            f"{r['stablehlo_lines']:,} | {r['threefry_calls']} | "
            f"{r['rng_bit_generator']} | {r['host_callbacks']} | {r['step_ms']:.2f} | "
            f"{r['tokens_per_s']:,.0f} |"
        )
    by = {r["key"]: r for r in rows if "error" not in r}
    lines += ["", "Ratios (goals: dropout's step <= 1.03x and first step <= 1.2x of "
              "the step without; boxwood's first step <= 1.05x the hand-written one's):", ""]  # fmt: skip
    for drop in ("rbg", "threefry"):
        if drop in by:
            lines.append(
                f"- dropout ({drop}) / dropout 0: step "
                f"{_ratio(by, drop, 'none', 'step_ms')}, first step "
                f"{_ratio(by, drop, 'none', 'first_step_s')}, XLA compile "
                f"{_ratio(by, drop, 'none', 'compile_s')}"
            )
    lines.append(
        f"- boxwood dropout 0 / hand-written: first step "
        f"{_ratio(by, 'none', 'jax', 'first_step_s')}, trace "
        f"{_ratio(by, 'none', 'jax', 'trace_s')}, lower "
        f"{_ratio(by, 'none', 'jax', 'lower_s')}, XLA compile "
        f"{_ratio(by, 'none', 'jax', 'compile_s')}, step "
        f"{_ratio(by, 'none', 'jax', 'step_ms')}"
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU check)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "first-step")
    p.add_argument("--order", default="jax,none,rbg", help="of " + ",".join(CONTENDERS))
    p.add_argument("--warm", action="store_true", help="a tiny warm-up step first")
    p.add_argument("--cache", default="", help="JAX's persistent cache folder")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--target", type=float, default=1.0, help="seconds a repetition")
    p.add_argument(
        "--budget", type=float, default=1e9, help="seconds; later steps skipped"
    )
    p.add_argument(
        "--fresh", type=int, default=0, metavar="ROUNDS",
        help="each contender in its own process, ROUNDS rounds in alternating order",
    )  # fmt: skip
    p.add_argument("--child-timeout", type=float, default=150.0, help="with --fresh")
    p.add_argument(
        "--profile", action="store_true",
        help="cProfile each first step into OUT/profile-<key>.txt (with --fresh: "
        "in one more process per contender, after the timed rounds)",
    )  # fmt: skip
    args = p.parse_args()
    if args.quick or os.environ.get("TPU_FIRST_STEP_QUICK") == "1":
        args.quick = True
    if args.fresh:
        if args.cache:
            p.error("--fresh and --cache: each process would read what the last wrote")
        # before anything starts JAX's backend here: a TPU serves one process
        return fresh_rounds(args, p)
    if args.cache:
        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    started = time.monotonic()
    case = cases.train_cases(args.quick)["gpt2"]
    kind = "splash" if jax.default_backend() == "tpu" else "xla"
    order = [k for k in args.order.split(",") if k]
    unknown = [k for k in order if k not in CONTENDERS]
    if unknown:
        p.error(f"--order: unknown {unknown}; choose from {', '.join(CONTENDERS)}")
    meta = {
        "device": jax.devices()[0].device_kind, "label": case.label, "jax": jax.__version__,
        "attention": kind, "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cache": args.cache, "order": ",".join(order), "warm": args.warm,
        "on_error": os.environ.get("BOXWOOD_ON_ERROR", ""),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    if args.warm:
        try:
            _warm_up(case, kind)
        except Exception as error:  # noqa: BLE001 - the figures go on without it
            meta["warm"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
    rows: list[dict] = []
    for key in order:
        if time.monotonic() - started > args.budget:
            rows.append({"contender": CONTENDERS[key], "key": key,
                         "error": "skipped: budget spent"})  # fmt: skip
            continue
        print(f"[tpu_first_step] {CONTENDERS[key]}", file=sys.stderr, flush=True)
        try:
            profile = args.out if args.profile else None
            rows.append(measure(key, case, kind, args.reps, args.target, profile))
        except Exception as error:  # noqa: BLE001 - one failed contender, reported
            rows.append({"contender": CONTENDERS[key], "key": key,
                         "error": f"{type(error).__name__}: {str(error)[:300]}"})  # fmt: skip
        (args.out / "first_step.json").write_text(
            json.dumps({"meta": meta, "rows": rows}, indent=1, default=str)
        )
        (args.out / "first_step.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
