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
    "cnn": "CNN: 4 Conv2d + BatchNorm, Linear head",
    "transformer": "transformer, 12 blocks (d=128)",
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
    for rep in range(reps):
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


def _warm_restart(reps: int) -> list[dict]:
    firsts, seconds = [], []
    for rep in range(reps):
        with tempfile.TemporaryDirectory(prefix="boxwood-cache-") as folder:
            print(f"  [cold start] rep {rep + 1}/{reps}: warm restart", file=sys.stderr)
            firsts.append(_child("boxwood", "step_list", folder))
            seconds.append(_child("boxwood", "step_list", folder))
    samples = {"first process": firsts, "second process": seconds}
    case = "transformer (list), with enable_compilation_cache"
    return _rows(case, "total", "total", samples, "first process")


def run(quick: bool) -> list[dict]:
    reps = 1 if quick else 3
    rows = []
    cases = list(BUILD_CASES) if not quick else ["mlp", "transformer"]
    jobs = [(lib, case) for case in cases for lib in ("boxwood", "equinox")]
    results = _round_robin(jobs, reps)
    for case in cases:
        samples = {lib: results[(lib, case)] for lib in ("boxwood", "equinox")}
        rows += _rows(BUILD_CASES[case], "build", "build", samples, "equinox")
    jobs = [
        ("boxwood", "step_list"),
        ("equinox", "step_list"),
        ("boxwood", "step_stacked"),
    ]
    results = _round_robin(jobs, reps)
    for case in STEP_CASES:
        samples = {
            "boxwood": results[("boxwood", case)],
            "equinox": results[("equinox", "step_list")],
        }
        for metric in ("total", "build", "step", "trace", "lower", "compile"):
            rows += _rows(STEP_CASES[case], metric, metric, samples, "equinox")
    return rows + _warm_restart(reps)
