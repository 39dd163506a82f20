"""What the paired A/B scripts share (`paired_ab.py`, `paired_capture.py`): the
child process's models and timing loop, fresh processes of two source trees run
in turn, and the table of their medians."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# The start of every child program; the script's own part follows it and prints
# one JSON object of cell -> ratio (and, where it says, `c_path`).
_CHILD_START = r"""
import json, statistics, sys, time
import jax, jax.numpy as jnp
import boxwood as bw

class MLP(bw.Module):  # tuples: a module holding a list (mutable) has no flat form
    ws: tuple
    bs: tuple
    def __call__(self, x):
        for w, b in zip(self.ws, self.bs):
            x = jnp.tanh(w @ x + b)
        return x

def build(leaves):
    k = jax.random.key(0)
    n = leaves // 2
    return MLP(tuple(jax.random.normal(jax.random.fold_in(k, i), (4, 4)) for i in range(n)),
               tuple(jnp.zeros(4) for _ in range(n)))

def apply(model, x):
    return model(x)

def batch(call, n):
    t = time.perf_counter()
    out = None
    for _ in range(n):
        out = call()
    jax.block_until_ready(out)
    return time.perf_counter() - t

def ratio(ours, theirs, n, rounds=ROUNDS):
    for _ in range(3):
        batch(ours, 50); batch(theirs, 50)
    return statistics.median(batch(ours, n) / batch(theirs, n) for _ in range(rounds))
"""


def run_child(src: str, body: str, ratio_rounds: int, extra: list[str]) -> dict:
    """The JSON a fresh process prints running `body` on the boxwood of `src`
    (first on `PYTHONPATH`; `BOXWOOD_PURE_PYTHON` unset unless `extra`, a list
    of `K=V`, sets it), with `ratio_rounds` interleaved batches per ratio."""
    path = os.pathsep.join(
        p for p in (os.path.abspath(src), os.environ.get("PYTHONPATH")) if p
    )
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")
    env.pop("BOXWOOD_PURE_PYTHON", None)
    env.update(item.split("=", 1) for item in extra)
    program = f"ROUNDS = {ratio_rounds}\n{_CHILD_START}{body}"
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"child for {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(doc: str, body: str, rounds: int, ratio_rounds: int) -> None:
    """The command line of a paired script: `A_SRC B_SRC [--rounds N]
    [--a-env K=V] [--b-env K=V] [--out FILE]`; fresh processes alternate A, B,
    A, B, ... (`rounds` of each by default), then the table: per cell, the
    median over the processes of A and of B and the difference B - A."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("a", help="the src folder of version A")
    parser.add_argument("b", help="the src folder of version B")
    parser.add_argument("--rounds", type=int, default=rounds)
    for side in ("a", "b"):
        parser.add_argument(
            f"--{side}-env", action="append", default=[], metavar="K=V",
            help=f"an environment variable for {side.upper()}'s processes",
        )  # fmt: skip
    parser.add_argument("--out", help="write the per-process results as JSON")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b"):
            extra = getattr(args, f"{side}_env")
            src = getattr(args, side)
            results[side].append(run_child(src, body, ratio_rounds, extra))
            print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr)
    _table(results)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


def _table(results: dict[str, list[dict]]) -> None:
    """The Markdown table of the medians; where the processes report `c_path`,
    each side's header says whether it ran boxwood's C path or pure Python."""
    label = {side: side.upper() for side in results}
    if "c_path" in results["a"][0]:
        for side, processes in results.items():
            path = "C" if all(p["c_path"] for p in processes) else "Python"
            label[side] = f"{side.upper()} ({path})"
    print(f"| cell | {label['a']} | {label['b']} | B - A |")
    print("|---|---|---|---|")
    for cell in (k for k in results["a"][0] if k != "c_path"):
        a = statistics.median(p[cell] for p in results["a"])
        b = statistics.median(p[cell] for p in results["b"])
        print(f"| {cell} | {a:.3f}x | {b:.3f}x | {b - a:+.3f}x |")
