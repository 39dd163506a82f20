"""Paired A/B of the warm path with and without captured values, between two
boxwood source trees: a shorter `paired_ab.py` for a busy machine.

    python benchmarks/paired_capture.py A_SRC B_SRC [--rounds 3] [--a-env K=V] [--out FILE]

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

from _paired import main

# after `_paired`'s start: `MLP`, `build`, `apply`, `batch`, `ratio`
CHILD = r"""
class MLPAct(MLP):  # its method reads a global: watched for module arguments
    def __call__(self, x):
        for w, b in zip(self.ws, self.bs):
            x = act(w @ x + b)
        return x

act = jnp.tanh
LR = 0.1

def shifted(v):
    return v + 1.0

def apply_reading(model, x):
    return shifted(model(x)) * LR

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

if __name__ == "__main__":
    main(__doc__, CHILD, rounds=3, ratio_rounds=9)
