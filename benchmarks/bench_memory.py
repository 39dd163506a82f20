"""Figure 6, memory: a training loop whose step donates the model and optimiser
state, so every step reuses their buffers instead of allocating new ones.

The step takes the batch first and is compiled with
`filter_jit(donate="all-except-first")`: the model and optimiser state (later
arguments) are donated, the batch (the first argument, reused by every step) is
kept. (`donate="all"` would donate the batch too, deleting it after the first
step.) The number of live device buffers must be the same at step 10 and at the
end, and the first step's input buffers must have been deleted (donated).
"""

from __future__ import annotations

import gc

import equinox as eqx
import jax
import optax

import boxwood
from _models import build, layers_for, make_weights, mse, raw_apply
from _timing import interleave, row, timing_rows
from bench_train_step import LEARNING_RATE, batch_data

FIGURE = "memory (donation)"
LEAVES = 130


def _boxwood_step(tx):
    vg = getattr(boxwood, "filter_value_and_grad", None) or jax.value_and_grad

    def step(batch, model, opt_state):
        x, y = batch
        loss, grads = vg(lambda m: mse(m(x), y))(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return boxwood.apply_updates(model, updates), opt_state, loss

    return boxwood.filter_jit(step, donate="all-except-first")


def _raw_step(tx):
    def step(batch, params, opt_state):
        x, y = batch
        loss, grads = jax.value_and_grad(lambda p: mse(raw_apply(p, x), y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(1, 2))


def _live() -> int:
    gc.collect()
    return len(jax.live_arrays())


def _loop(step, model, opt_state, batch, steps: int) -> dict:
    """Run `steps` steps; **returns** the buffer counts."""
    first_inputs = jax.tree_util.tree_leaves((model, opt_state))
    live_at_10 = None
    for i in range(steps):
        model, opt_state, loss = step(batch, model, opt_state)
        if i == 9:
            jax.block_until_ready(loss)
            live_at_10 = _live()
    jax.block_until_ready((model, opt_state, loss))
    return {
        "live buffers at step 10": live_at_10,
        "live buffers at end": _live(),
        "first-step inputs deleted": sum(a.is_deleted() for a in first_inputs),
        "first-step inputs": len(first_inputs),
        "batch kept": not any(a.is_deleted() for a in batch),
    }


def _fresh(kind: str, weights: list, tx) -> tuple:
    model = build(kind, weights)
    return model, tx.init(eqx.filter(model, eqx.is_inexact_array))


def _runner(step, state: list, batch):
    def run(n: int) -> None:
        model, opt_state = state
        for _ in range(n):
            model, opt_state, loss = step(batch, model, opt_state)
        jax.block_until_ready(loss)
        state[:] = [model, opt_state]

    return run


def _note(name: str, res: dict) -> str:
    stable = res["live buffers at step 10"] == res["live buffers at end"]
    deleted, total = res["first-step inputs deleted"], res["first-step inputs"]
    return (
        f"{name}: live buffers {'stable' if stable else 'GROWING'}; "
        f"{deleted}/{total} first-step inputs deleted"
        f"{'' if deleted == total else ' (NOT all donated)'}; "
        f"batch {'kept' if res['batch kept'] else 'DELETED'}"
    )


def run(quick: bool) -> list[dict]:
    steps = 100 if quick else 1000
    tx = optax.adam(LEARNING_RATE)
    weights = make_weights(layers_for(LEAVES), seed=LEAVES)
    batch = batch_data()
    case = f"{LEAVES} leaves, adam, {steps} steps"
    rows, steps_of = [], {}
    contenders = (("jax.jit", "raw", _raw_step), ("boxwood", "boxwood", _boxwood_step))
    for name, kind, make in contenders:  # one at a time, so the counts are its own
        steps_of[name] = step = make(tx)
        res = _loop(step, *_fresh(kind, weights, tx), batch, steps)
        note = _note(name, res)
        rows += [row(FIGURE, case, name, k, v, "", note=note) for k, v in res.items()]
    # Then the donated step's speed, timed side by side like the other figures.
    runners = {
        name: _runner(steps_of[name], list(_fresh(kind, weights, tx)), batch)
        for name, kind, _ in contenders
    }
    results = interleave(
        runners, reps=3 if quick else 15, target_s=0.03 if quick else 0.08
    )
    rows += timing_rows(FIGURE, case, results, limit="jax.jit", metric="time per step")
    return rows
