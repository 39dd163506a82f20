"""Paired A/B of the warm path with and without captured values, between two
boxwood source trees: a shorter `paired_ab.py` for a busy machine.

    python benchmarks/paired_capture.py A_SRC B_SRC [--rounds 3] [--out FILE]

Fresh processes alternate A, B, A, B, ... (`--rounds` of each). Each process
measures, as ratios to `jax.jit` of the same function on the same arguments (the
median over interleaved batches): `filter_jit(apply)` at 4 and 130 leaves (the
model passed as an argument: the dispatch figures), and at 4 leaves a function that
also reads a global float and a helper function (watched names, no arrays: the
capture layer's per-call check, keyed constants), and at 4 leaves a module
argument whose method reads a global function (watched from the first trace on).
The table gives, per cell, the
median over the processes of A and of B and the difference B - A. Only public API
is used, so any two versions compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, time
import jax, jax.numpy as jnp
import boxwood as bw

class MLP(bw.Module):
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

class MLPAct(MLP):  # its method reads a global: watched for module arguments
    def __call__(self, x):
        for w, b in zip(self.ws, self.bs):
            x = act(w @ x + b)
        return x

act = jnp.tanh
LR = 0.1

def shifted(v):
    return v + 1.0

def apply(model, x):
    return model(x)

def apply_reading(model, x):
    return shifted(model(x)) * LR

def batch(call, n):
    t = time.perf_counter()
    out = None
    for _ in range(n):
        out = call()
    jax.block_until_ready(out)
    return time.perf_counter() - t

def ratio(ours, theirs, n, rounds=9):
    for _ in range(3):
        batch(ours, 50); batch(theirs, 50)
    return statistics.median(batch(ours, n) / batch(theirs, n) for _ in range(rounds))

out = {}
x = jnp.ones(4)
for leaves in (4, 130):
    m = build(leaves)
    f, g = bw.filter_jit(apply), jax.jit(apply)
    out[f"{leaves} leaves, positional"] = ratio(lambda: f(m, x), lambda: g(m, x), 1000)
m = build(4)
f, g = bw.filter_jit(apply_reading), jax.jit(apply_reading)
out["4 leaves, reads a global float and a helper"] = ratio(
    lambda: f(m, x), lambda: g(m, x), 1000)
mact = MLPAct(m.ws, m.bs)
f, g = bw.filter_jit(apply), jax.jit(apply)
out["4 leaves, its method reads a global"] = ratio(
    lambda: f(mact, x), lambda: g(mact, x), 1000)
print(json.dumps(out))
"""


def run_child(src: str) -> dict:
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", CHILD],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"child for {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="the src folder of version A")
    parser.add_argument("b", help="the src folder of version B")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the per-process results as JSON")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b"):
            results[side].append(run_child(os.path.abspath(getattr(args, side))))
            print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr)
    print("| cell | A | B | B - A |")
    print("|---|---|---|---|")
    for cell in results["a"][0]:
        a = statistics.median(p[cell] for p in results["a"])
        b = statistics.median(p[cell] for p in results["b"])
        print(f"| {cell} | {a:.3f}x | {b:.3f}x | {b - a:+.3f}x |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
