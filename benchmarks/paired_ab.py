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

from _paired import main

# after `_paired`'s start: `MLP`, `build`, `apply`, `batch`, `ratio`
CHILD = r"""
def step(model, x, y):
    def loss(m):
        return jnp.mean((m(x) - y) ** 2)
    value, grads = jax.value_and_grad(loss)(model)
    return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads), value

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

if __name__ == "__main__":
    main(__doc__, CHILD, rounds=5, ratio_rounds=15)
