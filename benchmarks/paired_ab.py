"""Paired A/B of `filter_jit`'s per-call cost between two boxwood source trees.

    python benchmarks/paired_ab.py A_SRC B_SRC [--rounds 5] [--a-env K=V] [--out FILE]

`A_SRC` and `B_SRC` are `src` folders of two checkouts (an older checkout with a C
extension is built in place first: `python setup.py build_ext --inplace`; its
`c_path` column then reads `True`). Fresh processes alternate
A, B, A, B, ... (`--rounds` of each); each process measures, for models of 4, 20,
130 and 1000 leaves, `filter_jit(apply)` called positionally and with keywords, and
a training step (`jax.value_and_grad` and an SGD update) at 20 and 130 leaves, each
as a ratio to `jax.jit` of the same function on the same arguments: the median over
15 interleaved rounds of the two. The table gives, per cell, the median over the
processes of A and of B and the difference B - A (in units of `jax.jit`'s time).
`--a-env`/`--b-env K=V` set an environment variable for one side's processes
(`--a-env BOXWOOD_PURE_PYTHON=1`: an older checkout's Python path). Only public
API is used, so any two versions compare. Run it on an idle machine: the two trees
share it in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
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

def step(model, x, y):
    def loss(m):
        return jnp.mean((m(x) - y) ** 2)
    value, grads = jax.value_and_grad(loss)(model)
    return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads), value

def batch(call, n):
    t = time.perf_counter()
    out = None
    for _ in range(n):
        out = call()
    jax.block_until_ready(out)
    return time.perf_counter() - t

def ratio(ours, theirs, n, rounds=15):
    for _ in range(3):
        batch(ours, 50); batch(theirs, 50)
    return statistics.median(batch(ours, n) / batch(theirs, n) for _ in range(rounds))

out = {}
x = jnp.ones(4)
for leaves in (4, 20, 130, 1000):
    m = build(leaves)
    n = 2000 if leaves < 1000 else 500
    f, g = bw.filter_jit(apply), jax.jit(apply)
    out[f"{leaves} leaves, positional"] = ratio(lambda: f(m, x), lambda: g(m, x), n)
    out[f"{leaves} leaves, keywords"] = ratio(
        lambda: f(model=m, x=x), lambda: g(model=m, x=x), n)
for leaves in (20, 130):
    m = build(leaves)
    f, g = bw.filter_jit(step), jax.jit(step)
    out[f"train step, {leaves} leaves"] = ratio(
        lambda: f(m, x, x), lambda: g(m, x, x), 1000)
out["c_path"] = type(bw.filter_jit(apply)).__name__ == "FastCall"
print(json.dumps(out))
"""


def run_child(src: str, extra: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=src, JAX_PLATFORMS="cpu")
    env.pop("BOXWOOD_PURE_PYTHON", None)
    env.update(item.split("=", 1) for item in extra)
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
    parser.add_argument("--rounds", type=int, default=5)
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
            results[side].append(run_child(getattr(args, side), extra))
            print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr)
    path = {
        side: "C" if all(p["c_path"] for p in results[side]) else "Python"
        for side in ("a", "b")
    }
    cells = [k for k in results["a"][0] if k != "c_path"]
    print(f"| cell | A ({path['a']}) | B ({path['b']}) | B - A |")
    print("|---|---|---|---|")
    for cell in cells:
        a = statistics.median(p[cell] for p in results["a"])
        b = statistics.median(p[cell] for p in results["b"])
        print(f"| {cell} | {a:.3f}x | {b:.3f}x | {b - a:+.3f}x |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
