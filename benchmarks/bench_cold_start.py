"""Cold start: build time, time to the first training step, and a warm restart with
the persistent compilation cache; boxwood and equinox side by side, each
measurement in a fresh process (`_cold_child.py`).

Repetitions are round-robin: in each, every (case, library) runs once, the order
rotating, so the load of a shared machine falls on both libraries alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import median, paired_ratio, row

FIGURE = "cold start"
HERE = Path(__file__).resolve().parent
BUILD_CASES = {
    "mlp": "MLP(64, 10, 256, depth=8)",
    "mlp_lecun": "the MLP's 9 Linear layers built with lecun_normal weights",
    "mlp_reinit_lecun": "the MLP, then its weights re-initialised, lecun_normal",
    "mlp_reinit_orthogonal": "the MLP, then its weights re-initialised, orthogonal",
    "cnn": "CNN: 4 Conv2d + BatchNorm, Linear head",
    "transformer": "transformer, 12 blocks (d=128)",
    "transformer_jax_split": "transformer, boxwood's model code with jax.random.split",
    "keys": "transformer's key splitting alone (boxwood: bw.random.split_keys)",
    "gru": "GRUCell(64, 256)",
    "lstm": "LSTMCell(64, 256)",
}
STEP_CASES = {
    "step_list": "transformer as a list of blocks",
    "step_stacked": "transformer with nn.Stacked (equinox: list)",
}


def _child(lib: str, case: str, cache: str | None = None) -> dict:
    cmd = [sys.executable, str(HERE / "_cold_child.py"), lib, case]
    if cache is not None:
        cmd += ["--cache", cache]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{lib} {case}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _round_robin(jobs: list[tuple], reps: int) -> dict[tuple, list[dict]]:
    results: dict[tuple, list[dict]] = {job: [] for job in jobs}
    for rep in range(reps if jobs else 0):
        for job in jobs[rep % len(jobs) :] + jobs[: rep % len(jobs)]:
            print(f"  [cold start] rep {rep + 1}/{reps}: {job}", file=sys.stderr)
            results[job].append(_child(*job))
    return results


def _rows(case: str, metric: str, key: str, samples: dict, ratio_to: str) -> list:
    rows = []
    base = [s[key] for s in samples[ratio_to]]
    for name, runs in samples.items():
        values = [s[key] for s in runs]
        rows.append(
            row(
                FIGURE,
                case,
                name,
                metric,
                median(values),
                "s",
                ratio=None if name == ratio_to else median(values) / median(base),
                ratio_to=ratio_to,
                paired_ratio=paired_ratio(values, base),
                samples=values,
                reps=len(values),
            )  # fmt: skip
        )
    return rows


WARM_CASES = {
    "step_list": "transformer (list), with enable_compilation_cache",
    "step_stacked": "transformer (nn.Stacked), with enable_compilation_cache",
}


def _warm_restart(reps: int) -> list[dict]:
    """Two processes in a row on one fresh cache folder, per model; rows for the
    total and for its parts (`compile` in the second process is loading the
    cached executables)."""
    rows = []
    for case, label in WARM_CASES.items():
        firsts, seconds = [], []
        for rep in range(reps):
            with tempfile.TemporaryDirectory(prefix="boxwood-cache-") as folder:
                print(f"  [cold start] rep {rep + 1}/{reps}: warm restart, {case}",
                      file=sys.stderr)  # fmt: skip
                firsts.append(_child("boxwood", case, folder))
                seconds.append(_child("boxwood", case, folder))
        samples = {"first process": firsts, "second process": seconds}
        for metric in ("total", "import", "build", "trace", "lower", "compile"):
            rows += _rows(label, metric, metric, samples, "first process")
    return rows


def run(quick: bool, cases: list[str] | None = None, reps: int | None = None) -> list:
    """The cold-start rows. `cases` (default: all; `--quick`: `mlp`, `transformer`
    and the step cases) picks among `BUILD_CASES`, `STEP_CASES` and `"warm"` (the
    warm restart); `reps` overrides the repetitions (3; `--quick`: 1)."""
    reps = reps or (1 if quick else 3)
    if cases is None:
        cases = ["mlp", "transformer"] if quick else list(BUILD_CASES)
        cases += [*STEP_CASES, "warm"]
    unknown = set(cases) - {*BUILD_CASES, *STEP_CASES, "warm"}
    if unknown:
        raise ValueError(f"unknown cold-start cases {sorted(unknown)}")
    rows = []
    build = [c for c in BUILD_CASES if c in cases]
    jobs = [
        (lib, case)
        for case in build
        for lib in ("boxwood", "equinox")
        if (lib, case) != ("equinox", "transformer_jax_split")
    ]
    if "transformer_jax_split" in build and "transformer" not in build:
        jobs.append(("equinox", "transformer"))
    results = _round_robin(jobs, reps)
    for case in build:
        base = "transformer" if case == "transformer_jax_split" else case
        samples = {
            "boxwood": results[("boxwood", case)],
            "equinox": results[("equinox", base)],
        }
        rows += _rows(BUILD_CASES[case], "build", "build", samples, "equinox")
    steps = [c for c in STEP_CASES if c in cases]
    jobs = [("boxwood", case) for case in steps]
    jobs += [("equinox", "step_list")] if steps else []
    results = _round_robin(jobs, reps)
    for case in steps:
        samples = {
            "boxwood": results[("boxwood", case)],
            "equinox": results[("equinox", "step_list")],
        }
        for metric in ("total", "build", "step", "trace", "lower", "compile"):
            rows += _rows(STEP_CASES[case], metric, metric, samples, "equinox")
    return rows + (_warm_restart(reps) if "warm" in cases else [])


def main(argv: list[str]) -> None:
    """`python benchmarks/bench_cold_start.py [--cases a,b] [--reps N] [--out F]`:
    run chosen cases only, print their rows as a table, and write them (with every
    sample) to the JSON file `F`."""
    import argparse
    import datetime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated, e.g. transformer,lstm")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args(argv)
    cases = args.cases.split(",") if args.cases else None
    load = os.getloadavg()[0]
    start = datetime.datetime.now(datetime.timezone.utc)
    rows = run(False, cases, args.reps)
    print(f"{start:%Y-%m-%d %H:%M} UTC, load average at start {load:.1f}, "
          f"at end {os.getloadavg()[0]:.1f}, {args.reps} repetitions")  # fmt: skip
    for r in rows:
        ratio = "" if r.get("ratio") is None else f" ({r['ratio']:.2f}x)"
        print(f"| {r['case']} | {r['metric']} | {r['contender']} | "
              f"{r['value']:.3g} s{ratio} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
