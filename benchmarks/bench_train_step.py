"""Figure 2, training step: value-and-grad of an MSE loss, an optax adam update,
returning the new model and optimiser state. Each step's outputs feed the next call,
as in a real training loop.

Also the *seed scenario*: three models and three optimiser states updated in one
step (e.g. three seeds of the same experiment), where the per-call overhead grows
with the number of arguments.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import optax
from flax import nnx

import boxwood
from _models import (
    WIDTH,
    build,
    layers_for,
    make_weights,
    mse,
    raw_apply,
)
from _timing import block, interleave, skipped_row, timing_rows

FIGURE = "train step"
SEED_FIGURE = "train step, 3 models (seed scenario)"
LEAVES = (4, 20, 130, 1000)
BATCH = 8
LEARNING_RATE = 1e-3

_value_and_grad = getattr(boxwood, "filter_value_and_grad", None)


def batch_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    y = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    return jax.numpy.asarray(x), jax.numpy.asarray(y)


# ---------------------------------------------------------------------- one model
def raw_step(tx, opt_def):
    """`jax.jit` over flat lists of parameters and of optimiser-state leaves."""

    def step(params, opt_leaves, x, y):
        opt_state = opt_def.unflatten(opt_leaves)
        loss, grads = jax.value_and_grad(lambda p: mse(raw_apply(p, x), y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, jax.tree_util.tree_leaves(opt_state), loss

    return jax.jit(step)


def boxwood_step(tx):
    def loss_fn(model, x, y):
        return mse(model(x), y)

    grad_fn = (
        _value_and_grad(loss_fn) if _value_and_grad else jax.value_and_grad(loss_fn)
    )

    @boxwood.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = grad_fn(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, model)
        return boxwood.apply_updates(model, updates), opt_state, loss

    return step


def equinox_step(tx):
    @eqx.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(lambda m: mse(m(x), y))(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    return step


def nnx_step():
    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
        optimizer.update(model, grads)
        return loss

    return step


def _functional_runner(step, state: list, x, y):
    """A batch runner threading `(model, opt_state)` through `step`."""

    def run(n: int) -> None:
        model, opt_state = state
        loss = None
        for _ in range(n):
            model, opt_state, loss = step(model, opt_state, x, y)
        block(loss)
        state[:] = [model, opt_state]

    return run


KEYWORDS = ", keywords"


def _keyword_runner(step, state: list, x, y):
    """`_functional_runner` with every argument passed by keyword."""

    def run(n: int) -> None:
        model, opt_state = state
        loss = None
        for _ in range(n):
            model, opt_state, loss = step(model=model, opt_state=opt_state, x=x, y=y)
        block(loss)
        state[:] = [model, opt_state]

    return run


def _nnx_runner(step, model, optimizer, x, y):
    def run(n: int) -> None:
        loss = None
        for _ in range(n):
            loss = step(model, optimizer, x, y)
        block(loss)

    return run


def _single(leaves: int, skip_nnx: bool) -> tuple[dict, dict]:
    """Runners and first-step losses (for the equality check)."""
    tx = optax.adam(LEARNING_RATE)
    weights = make_weights(layers_for(leaves), seed=leaves)
    x, y = batch_data()
    runners, losses = {}, {}

    params = build("raw", weights)
    opt_leaves, opt_def = jax.tree_util.tree_flatten(tx.init(params))
    step = raw_step(tx, opt_def)
    state = [params, opt_leaves]
    losses["raw"] = step(params, opt_leaves, x, y)[2]
    runners["raw"] = _functional_runner(step, state, x, y)

    for kind, make in (("boxwood", boxwood_step), ("equinox", equinox_step)):
        model = build(kind, weights)
        opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))
        step = make(tx)
        losses[kind] = step(model, opt_state, x, y)[2]
        runners[kind] = _functional_runner(step, [model, opt_state], x, y)
    model = build("boxwood", weights)
    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))
    step = boxwood_step(tx)
    losses["boxwood" + KEYWORDS] = step(model=model, opt_state=opt_state, x=x, y=y)[2]
    runners["boxwood" + KEYWORDS] = _keyword_runner(step, [model, opt_state], x, y)

    if not skip_nnx:
        model = build("nnx", weights)
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        step = nnx_step()
        losses["nnx"] = step(model, optimizer, x, y)  # the first step, as above
        runners["nnx"] = _nnx_runner(step, model, optimizer, x, y)
    return runners, losses


# --------------------------------------------------------------- three models
def raw_step3(tx, opt_def):
    def loss3(ps, x, y):
        return sum(mse(raw_apply(p, x), y) for p in ps)

    def step(p1, p2, p3, o1, o2, o3, x, y):
        params = (p1, p2, p3)
        loss, grads = jax.value_and_grad(loss3)(params, x, y)
        outs = []
        for p, o, g in zip(params, (o1, o2, o3), grads):
            updates, o = tx.update(g, opt_def.unflatten(o), p)
            outs.append((optax.apply_updates(p, updates), jax.tree_util.tree_leaves(o)))
        (p1, o1), (p2, o2), (p3, o3) = outs
        return p1, p2, p3, o1, o2, o3, loss

    return jax.jit(step)


def _filtered_step3(jit, value_and_grad, apply_updates, tx):
    def loss3(models, x, y):
        return sum(mse(m(x), y) for m in models)

    @jit
    def step(m1, m2, m3, s1, s2, s3, x, y):
        models = (m1, m2, m3)
        loss, grads = value_and_grad(loss3)(models, x, y)
        outs = []
        for m, s, g in zip(models, (s1, s2, s3), grads):
            updates, s = tx.update(g, s, m)
            outs.append((apply_updates(m, updates), s))
        (m1, s1), (m2, s2), (m3, s3) = outs
        return m1, m2, m3, s1, s2, s3, loss

    return step


def _runner3(step, state: list, x, y):
    def run(n: int) -> None:
        args = state[0]
        loss = None
        for _ in range(n):
            *args, loss = step(*args, x, y)
        block(loss)
        state[0] = args

    return run


def _three(leaves: int) -> tuple[dict, dict]:
    tx = optax.adam(LEARNING_RATE)
    weights = [make_weights(layers_for(leaves), seed=leaves + i) for i in range(3)]
    x, y = batch_data()
    runners, losses = {}, {}

    params = [build("raw", w) for w in weights]
    opt_def = jax.tree_util.tree_structure(tx.init(params[0]))
    opts = [jax.tree_util.tree_leaves(tx.init(p)) for p in params]
    step = raw_step3(tx, opt_def)
    losses["raw"] = step(*params, *opts, x, y)[-1]
    runners["raw"] = _runner3(step, [[*params, *opts]], x, y)

    bw_vg = _value_and_grad or jax.value_and_grad
    makers = {
        "boxwood": (boxwood.filter_jit, bw_vg, boxwood.apply_updates),
        "equinox": (eqx.filter_jit, eqx.filter_value_and_grad, eqx.apply_updates),
    }
    for kind, (jit, vg, apply) in makers.items():
        models = [build(kind, w) for w in weights]
        opts = [tx.init(eqx.filter(m, eqx.is_inexact_array)) for m in models]
        step = _filtered_step3(jit, vg, apply, tx)
        losses[kind] = step(*models, *opts, x, y)[-1]
        runners[kind] = _runner3(step, [[*models, *opts]], x, y)
    return runners, losses


def _check_losses(losses: dict) -> None:
    ref = float(losses["raw"])
    for name, loss in losses.items():
        np.testing.assert_allclose(float(loss), ref, rtol=1e-5, err_msg=name)


def run(quick: bool) -> list[dict]:
    reps = 3 if quick else 15
    target = 0.03 if quick else 0.08
    rows = []
    for leaves in LEAVES:
        case = f"{2 * layers_for(leaves)} leaves"
        if quick and leaves >= 1000:
            for name in ("raw", "boxwood", "equinox", "nnx"):
                rows.append(
                    skipped_row(FIGURE, case, name, "skipped (quick)", "time per step")
                )
            continue
        runners, losses = _single(leaves, skip_nnx=False)
        _check_losses(losses)
        results = interleave(runners, reps=reps, target_s=target, min_calls=3)
        rows += timing_rows(FIGURE, case, results, limit="raw", metric="time per step")
    for leaves in (20,) if quick else (20, 130):
        runners, losses = _three(leaves)
        _check_losses(losses)
        results = interleave(runners, reps=reps, target_s=target, min_calls=3)
        case = f"3 x {2 * layers_for(leaves)} leaves"
        rows += timing_rows(
            SEED_FIGURE, case, results, limit="raw", metric="time per step"
        )
    return rows
