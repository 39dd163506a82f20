"""Figure: a data-parallel training step on 8 simulated CPU devices, boxwood's
`filter_jit(in_shardings=..., out_shardings=...)` against a hand-written `jax.jit`
over flat lists with the same `NamedSharding`s (the limit).

Both donate the parameters and optimiser state and take the batch first (kept);
parameters are replicated, the batch is split over the `data` axis. The device count
is fixed when JAX starts, so `run` times everything in a child process started with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`, which prints its rows as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIGURE = "data parallel, 8 devices"
DEVICES = 8
WIDTH = 32
BATCH = 64
LEAVES = (4, 20, 130)
LEARNING_RATE = 1e-3


def run(quick: bool) -> list[dict]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    env["JAX_PLATFORMS"] = "cpu"
    # Each step runs to the end before the next is dispatched. With 8 simulated
    # devices on a few cores, XLA's CPU runtime can deadlock in a collective's
    # rendezvous when many asynchronously dispatched steps are queued (the process
    # aborts after 40 s: "Termination timeout for `all reduce ...`"). Both contenders
    # run the same way, so the figure is dispatch plus computation, step by step.
    env["JAX_CPU_ENABLE_ASYNC_DISPATCH"] = "false"
    args = [sys.executable, str(Path(__file__).resolve()), "--child"]
    out = subprocess.run(
        args + (["--quick"] if quick else []),
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"the 8-device child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -------------------------------------------------------- in the child process
def _contenders(n_layers: int) -> tuple[dict, dict]:
    import jax
    import numpy as np
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    import boxwood
    from _models import build, make_weights, mse, raw_apply
    from _timing import block

    mesh = boxwood.make_mesh((DEVICES,), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec("data"))
    tx = optax.adam(LEARNING_RATE)
    weights = make_weights(n_layers, WIDTH, seed=n_layers)
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((BATCH, WIDTH)).astype(np.float32) for _ in range(2))
    x, y = boxwood.shard_batch((x, y), mesh)

    # the limit: jax.jit over flat lists, the same shardings, the same donation
    params = boxwood.shard(build("raw", weights), mesh)
    opt_leaves, opt_def = jax.tree_util.tree_flatten(tx.init(params))
    opt_leaves = boxwood.shard(opt_leaves, mesh)

    def raw(x, y, params, opt_leaves):
        loss, grads = jax.value_and_grad(lambda p: mse(raw_apply(p, x), y))(params)
        updates, opt_state = tx.update(grads, opt_def.unflatten(opt_leaves), params)
        new = optax.apply_updates(params, updates)
        return new, jax.tree_util.tree_leaves(opt_state), loss

    p_sh, o_sh = [replicated] * len(params), [replicated] * len(opt_leaves)
    raw_step = jax.jit(
        raw,
        in_shardings=(split, split, p_sh, o_sh),
        out_shardings=(p_sh, o_sh, replicated),
        donate_argnums=(2, 3),
    )

    # boxwood: the model as a Module, shardings as prefixes from the rules
    model = build("boxwood", weights)
    opt_state = tx.init(model)
    rules = boxwood.data_parallel()
    model, opt_state = boxwood.shard((model, opt_state), mesh, rules)
    m_sh, s_sh = boxwood.named_shardings((model, opt_state), mesh, rules)

    @boxwood.filter_jit(
        donate="all-except-first",
        in_shardings=(split, m_sh, s_sh),
        out_shardings=(m_sh, s_sh, replicated),
    )
    def bw_step(batch, model, opt_state):
        x, y = batch
        loss, grads = boxwood.filter_value_and_grad(lambda m: mse(m(x), y))(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return boxwood.apply_updates(model, updates), opt_state, loss

    def raw_runner(state=[params, opt_leaves]):  # noqa: B006 (the state, threaded)
        def run(n):
            p, o = state
            for _ in range(n):
                p, o, loss = raw_step(x, y, p, o)
            block(loss)
            state[:] = [p, o]

        return run

    def bw_runner(state=[model, opt_state]):  # noqa: B006
        def run(n):
            m, s = state
            for _ in range(n):
                m, s, loss = bw_step((x, y), m, s)
            block(loss)
            state[:] = [m, s]

        return run

    first = {
        "jax.jit": float(raw_step(x, y, *boxwood.shard(
            (build("raw", weights), jax.tree_util.tree_leaves(
                tx.init(build("raw", weights)))), mesh))[2]),
        "boxwood": float(bw_step((x, y), *boxwood.shard(
            (build("boxwood", weights), tx.init(build("boxwood", weights))),
            mesh))[2]),
    }  # fmt: skip
    return {"jax.jit": raw_runner(), "boxwood": bw_runner()}, first


def _child(quick: bool) -> list[dict]:
    import numpy as np

    from _models import layers_for
    from _timing import interleave, timing_rows

    reps = 3 if quick else 15
    target = 0.03 if quick else 0.08
    rows = []
    for leaves in LEAVES[:2] if quick else LEAVES:
        runners, first = _contenders(layers_for(leaves))
        np.testing.assert_allclose(first["boxwood"], first["jax.jit"], rtol=1e-5)
        results = interleave(runners, reps=reps, target_s=target, min_calls=3)
        case = f"{2 * layers_for(leaves)} leaves"
        rows += timing_rows(
            FIGURE, case, results, limit="jax.jit", metric="time per step"
        )
    return rows


if __name__ == "__main__" and "--child" in sys.argv:
    import warnings

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    warnings.filterwarnings("ignore", message="This line has wrapped")
    print(json.dumps(_child("--quick" in sys.argv)))
