"""Figure 1, dispatch: the per-call overhead of calling a compiled `model(x)`.

The model is a tiny MLP (width 4, tanh), so the computation is negligible and the
time per call is the wrapper's own cost: flattening the arguments, finding the
compiled code, rebuilding the output. Calls in a batch are not blocked one by one;
the batch blocks once at the end.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import boxwood
from _models import (
    WIDTH,
    boxwood_fn_field,
    build,
    count_leaves,
    layers_for,
    make_weights,
    raw_apply,
)
from _timing import block, interleave, skipped_row, timing_rows

FIGURE = "dispatch"
LEAVES = (4, 20, 130, 1000)
QUICK_SKIP = ("equinox", "nnx")  # at 1000 leaves, in quick mode


def _apply(model, x):
    return model(x)


def _raw_kw(model, x):
    return raw_apply(model, x)


def _apply_key(model, x, key):  # a typed PRNG key passed along (dropout's, say)
    return model(x)


def _raw_key(model, x, key):
    return raw_apply(model, x)


def _batch(fn, *args):
    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = fn(*args)
        block(out)

    return run


def _kw_batch(fn, model, x):
    """The same calls with keyword arguments (`fn(model=model, x=x)`)."""

    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = fn(model=model, x=x)
        block(out)

    return run


KEYWORDS = ", keywords"
FN_FIELD = "boxwood, activation in a field"
WITH_KEY = ", typed key argument"


def _contenders(leaves: int, quick: bool) -> tuple[dict, dict, list]:
    """The runners, one output per contender (for the equality check), and the rows
    of skipped contenders."""
    weights = make_weights(layers_for(leaves), seed=leaves)
    x = jnp.asarray(np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32))
    models = {k: build(k, weights) for k in ("raw", "boxwood", "equinox", "nnx")}
    for kind, model in models.items():
        assert count_leaves(kind, model) == 2 * layers_for(leaves), kind
    fns = {
        "raw": jax.jit(raw_apply),
        "boxwood": boxwood.filter_jit(_apply),
        "equinox": eqx.filter_jit(_apply),
        "nnx": nnx.jit(_apply),
    }
    skipped = []
    if quick and leaves >= 1000:  # compiling 500 layers takes seconds per contender
        for name in QUICK_SKIP:
            del fns[name]
            skipped.append(skipped_row(FIGURE, _case(leaves), name, "skipped (quick)"))
    runners = {k: _batch(f, models[k], x) for k, f in fns.items()}
    outputs = {k: f(models[k], x) for k, f in fns.items()}
    # a function in an ordinary field (Equinox style): a static leaf in the flat form
    fn_model = boxwood_fn_field(weights)
    fn = boxwood.filter_jit(_apply)
    outputs[FN_FIELD] = fn(fn_model, x)
    runners[FN_FIELD] = _batch(fn, fn_model, x)
    key = jax.random.key(0)
    for k in ("raw", "boxwood"):  # a typed key argument, ratio to raw without one
        fn = jax.jit(_raw_key) if k == "raw" else boxwood.filter_jit(_apply_key)
        outputs[k + WITH_KEY] = fn(models[k], x, key)
        runners[k + WITH_KEY] = _batch(fn, models[k], x, key)
    for k in ("raw", "boxwood"):  # keyword arguments, ratio to raw positional calls
        fn = jax.jit(_raw_kw) if k == "raw" else boxwood.filter_jit(_apply)
        outputs[k + KEYWORDS] = fn(model=models[k], x=x)
        runners[k + KEYWORDS] = _kw_batch(fn, models[k], x)
    return runners, outputs, skipped


def _case(leaves: int) -> str:
    return f"{2 * layers_for(leaves)} leaves"


def _check_equal(outputs: dict) -> None:
    ref = np.asarray(outputs["raw"])
    for name, out in outputs.items():
        np.testing.assert_allclose(
            np.asarray(out), ref, rtol=1e-6, atol=1e-6, err_msg=name
        )


def run(quick: bool) -> list[dict]:
    reps = 3 if quick else 15
    target = 0.02 if quick else 0.05
    rows = []
    for leaves in LEAVES:
        runners, outputs, skipped = _contenders(leaves, quick)
        _check_equal(outputs)
        results = interleave(runners, reps=reps, target_s=target)
        rows += timing_rows(FIGURE, _case(leaves), results, limit="raw")
        rows += skipped
    return rows
