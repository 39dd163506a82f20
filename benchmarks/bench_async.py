"""Figure 4, asynchronous dispatch: a heavy computation (a chain of 1024x1024
matmuls with tanh) should return to Python as soon as it is enqueued, long before
it finishes. Measures the time for the call to *return* and, for reference, the
time until the result is ready.
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import boxwood
from _timing import block, interleave_once, median, paired_ratio, row

FIGURE = "async dispatch"
SIZE = 1024
N_MATMULS = 10


class BwChain(boxwood.Module):
    weights: tuple

    def __call__(self, x):
        return _chain(self.weights, x)


class EqxChain(eqx.Module):
    weights: tuple

    def __call__(self, x):
        return _chain(self.weights, x)


def _chain(weights, x):
    for w in weights:
        x = jnp.tanh(x @ w)
    return x


def _apply(model, x):
    return model(x)


def _weights() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(SIZE)
    return [
        (rng.standard_normal((SIZE, SIZE)) * scale).astype(np.float32)
        for _ in range(N_MATMULS)
    ]


def _runner(fn, *args):
    """Measure one call: the time to return, then the time until the output is
    ready (inputs are ready before the clock starts)."""

    def run() -> dict:
        block(args)
        start = time.perf_counter()
        out = fn(*args)
        returned = time.perf_counter()
        block(out)
        done = time.perf_counter()
        return {"return": returned - start, "finish": done - start}

    return run


def run(quick: bool) -> list[dict]:
    reps = 7 if quick else 11
    rows_x = 256 if quick else SIZE
    weights = _weights()
    x = jnp.asarray(
        np.random.default_rng(1).standard_normal((rows_x, SIZE)), jnp.float32
    )
    flat = [jnp.asarray(w) for w in weights]
    fns = {
        "jax.jit": (jax.jit(_chain), flat),
        "boxwood": (
            boxwood.filter_jit(_apply),
            BwChain(tuple(jnp.asarray(w) for w in weights)),
        ),
        "equinox": (
            eqx.filter_jit(_apply),
            EqxChain(tuple(jnp.asarray(w) for w in weights)),
        ),
    }
    outs = {}
    for name, (fn, model) in fns.items():  # warm up (compile) every contender
        outs[name] = np.asarray(fn(model, x))
    for name, out in outs.items():
        np.testing.assert_allclose(
            out, outs["jax.jit"], rtol=1e-5, atol=1e-5, err_msg=name
        )
    runners = {name: _runner(fn, model, x) for name, (fn, model) in fns.items()}
    results = interleave_once(runners, reps=reps)
    case = f"{N_MATMULS} matmuls ({rows_x}x{SIZE} @ {SIZE}x{SIZE}) + tanh"
    base = results["jax.jit"]["return"]
    rows = []
    for name, res in results.items():
        share = median([r / f for r, f in zip(res["return"], res["finish"])])
        note = (
            f"{name}: returns at {share:.1%} of the finish time "
            f"(fastest return {min(res['return']) * 1e6:,.0f} us)"
        )
        for metric in ("return", "finish"):
            samples = res[metric]
            rows.append(
                row(
                    FIGURE,
                    case,
                    name,
                    f"time to {metric}",
                    median(samples) * 1e6,
                    "us",
                    ratio=median(samples) / median(base)
                    if metric == "return"
                    else None,
                    paired_ratio=paired_ratio(samples, base)
                    if metric == "return"
                    else None,
                    ratio_to="jax.jit" if metric == "return" else None,
                    note=note if metric == "return" else "",
                    reps=reps,
                    samples=[s * 1e6 for s in samples],
                )
            )
    return rows
