"""Equinox's ecosystem on boxwood against the real Equinox: compile times and warm
run times of diffrax, optimistix and lineax.

    python benchmarks/ecosystem.py [--rounds 3] [--only compile,run] [--out FILE]
                                   [--cases NAME,...] [--src BOXWOOD_SRC]

Each figure runs in fresh processes, alternating: one process with the installed
Equinox, one with `equinox` pointed at boxwood (`sys.modules`, before the libraries
are imported), `--rounds` times each, starting with a different side each round. A
figure is the median over its processes; the table gives both medians and their
ratio (boxwood / Equinox). The machine's load average is recorded before every
process, so a figure taken on a busy machine shows it.

Compile figures (seconds for `jax.jit(f).lower(...).compile()`, tracing included) are
a neural ODE: an MLP vector field, `Dopri8` with a PID step-size controller, solved
with each of three adjoints (`DirectAdjoint`, `RecursiveCheckpointAdjoint`,
`BacksolveAdjoint`), with and without `jax.grad` of a loss on the solution, the
vector field called inline or through `equinox.internal.noinline`.

Run figures (seconds per warm call, median of interleaved batches) are a neural-ODE
solve and its gradient at two widths, an optimistix Newton root find and a
Levenberg-Marquardt least-squares fit, and a lineax LU and CG solve.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

ADJOINTS = ("direct", "recursive", "backsolve")
COMPILE_CASES = [
    f"compile:{inline}:{grad}:{adjoint}"
    for inline in ("noinline", "inline")
    for grad in ("nograd", "grad")
    for adjoint in ADJOINTS
]
RUN_CASES = [
    "run:ode:32",
    "run:ode:256",
    "run:ode_grad:32",
    "run:ode_grad:256",
    "run:newton",
    "run:lm",
    "run:lu",
    "run:cg",
]

CHILD = r"""
import json, sys, time
side, case = sys.argv[1], sys.argv[2]
if side == "boxwood":
    import boxwood, boxwood.nn, boxwood.debug, boxwood.internal
    sys.modules["equinox"] = boxwood
    sys.modules["equinox.nn"] = boxwood.nn
    sys.modules["equinox.debug"] = boxwood.debug
    sys.modules["equinox.internal"] = boxwood.internal
import jax, jax.numpy as jnp
import equinox as eqx
import equinox.internal as eqxi
import diffrax, lineax, optimistix
sys.path.insert(0, sys.argv[3])
import _ecosystem_cases as cases
print("RESULT" + json.dumps(cases.run(case, eqx, eqxi, diffrax, lineax, optimistix)))
"""


def _load() -> float:
    return os.getloadavg()[0]


def _child(side: str, case: str, src: str) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if src:
        env["PYTHONPATH"] = os.path.abspath(src)
    load = _load()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, side, case, here],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side} {case} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT") :])
    out["load"] = load
    return out


def measure(cases: list[str], rounds: int, src: str = "") -> list[dict]:
    rows = []
    for case in cases:
        seconds: dict[str, list[float]] = {"equinox": [], "boxwood": []}
        loads: list[float] = []
        for r in range(rounds):
            order = ("equinox", "boxwood") if r % 2 == 0 else ("boxwood", "equinox")
            for side in order:
                out = _child(side, case, src)
                seconds[side].append(out["seconds"])
                loads.append(out["load"])
        eq = statistics.median(seconds["equinox"])
        bw = statistics.median(seconds["boxwood"])
        row = {
            "case": case,
            "equinox_s": eq,
            "boxwood_s": bw,
            "ratio": bw / eq,
            "samples": seconds,
            "load_max": max(loads),
        }
        print(
            f"{case:32s} equinox {eq:8.4f}  boxwood {bw:8.4f}  "
            f"ratio {bw / eq:5.2f}  (load <= {max(loads):.2f})",
            flush=True,
        )
        rows.append(row)
    return rows


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="compile,run")
    parser.add_argument("--cases", default="", help="comma-separated case names")
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--src",
        default="",
        help="a boxwood `src` folder to use instead of the installed",
    )
    args = parser.parse_args()
    kinds = set(args.only.split(","))
    cases = [c for c in COMPILE_CASES + RUN_CASES if c.split(":")[0] in kinds]
    if args.cases:
        cases = [c for c in cases if c in args.cases.split(",")]
    rows = measure(cases, args.rounds, args.src)
    for kind in ("compile", "run"):
        ratios = [r["ratio"] for r in rows if r["case"].startswith(kind)]
        if ratios:
            print(f"{kind}: geometric mean of ratios {_geomean(ratios):.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "cpus": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
