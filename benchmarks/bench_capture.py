"""Figure 7, captured values: what it costs that `filter_jit` treats the arrays and
modules a function reads from its globals or closure as inputs.

- *dispatch*: time per call of a function that reads nothing watched (only
  arguments, constants and Python modules such as `jnp`: compiled exactly as
  before, with no layer at all), and of one that reads a helper function and a
  Python float from its globals (watched, no arrays), each against the same wrapper
  with `capture="constants"` (JAX's behaviour, nothing watched); and of `model(x)`
  with the 130-leaf model read from a global, against the model passed as an
  argument; `filter_jit(model)` whose method reads nothing, or reads a global
  array (then watched by a Python layer, to warn when it is rebound), and a
  function calling a `filter_value_and_grad` helper that reads a global array,
  each against `capture="constants"`. The column "called from a def" is `capture="constants"` called through
  a one-line Python function: what any Python frame between the caller and JAX's
  dispatch costs (on Python 3.11 JAX records a traceback of the calling frames with
  every dispatch, which makes an extra frame dearer than a plain Python call).
- *the layer alone*: the per-call work that capturing adds (read the watched
  names, test them, call the core with the hidden tuple: the generated function of
  `capture.Layer`), with a core that does nothing, against calling that core
  directly: the added cost without the noise of a dispatch.
- *200 MB array*: trace + compile time of the first call and the peak resident
  memory it adds, each contender in a fresh process: the array captured by a
  `filter_jit` function (an input), passed as an argument, and captured by a
  `jax.jit` function (embedded in the executable as a constant).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import boxwood
from _models import WIDTH, build, layers_for, make_weights
from _timing import block, interleave, median, row, timing_rows

FIGURE = "captured values"
LEAVES = 130
BIG_MB = 200

MODEL = None  # the captured model (a global, as in a notebook)
SCALE = 0.5


def _helper(x):
    return x * SCALE


def _reads_helper(x):
    return _helper(x)


def _reads_nothing(x):
    return jnp.tanh(x) * 0.5  # a module (`jnp`) and constants: nothing watched


def _reads_model(x):
    return MODEL(x)


TABLE = jnp.ones(WIDTH)  # a global array read inside a method


class _Plain(boxwood.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x  # reads nothing from globals: no layer


class _ReadsTable(boxwood.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x * TABLE  # watched to warn when `TABLE` is rebound


def _vg_body(w, x):
    return jnp.sum((w * x - TABLE) ** 2)


_VG = boxwood.filter_value_and_grad(_vg_body)


def _reads_transformed(w, x):
    return _VG(w, x)[0]  # a transformed helper that reads a global array


def _apply(model, x):
    return model(x)


def _batch(fn, *args):
    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = fn(*args)
        block(out)

    return run


def _dispatch_rows(quick: bool) -> list[dict]:
    global MODEL
    reps, target = (5, 0.02) if quick else (15, 0.05)
    x = jnp.asarray(np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32))
    runners = {
        "capture='constants'": _batch(
            boxwood.filter_jit(_reads_nothing, capture="constants"), x
        ),
        "captures watched (default)": _batch(boxwood.filter_jit(_reads_nothing), x),
    }
    rows = timing_rows(
        FIGURE,
        "reads nothing watched (jnp, constants)",
        interleave(runners, reps=reps, target_s=target),
        limit="capture='constants'",
    )
    constants = boxwood.filter_jit(_reads_helper, capture="constants")

    def in_a_def(x):  # any Python function between the caller and the dispatch
        return constants(x)

    runners = {
        "capture='constants'": _batch(constants, x),
        "captures watched (default)": _batch(boxwood.filter_jit(_reads_helper), x),
        "capture='constants' called from a def": _batch(in_a_def, x),
    }
    rows += timing_rows(
        FIGURE,
        "reads a helper and a float (no arrays)",
        interleave(runners, reps=reps, target_s=target),
        limit="capture='constants'",
    )
    rows += _method_rows(x, reps, target)
    MODEL = build("boxwood", make_weights(layers_for(LEAVES), seed=LEAVES))
    runners = {
        "model as an argument": _batch(boxwood.filter_jit(_apply), MODEL, x),
        "model captured (global)": _batch(boxwood.filter_jit(_reads_model), x),
    }
    rows += timing_rows(
        FIGURE,
        f"model(x), {LEAVES} leaves",
        interleave(runners, reps=reps, target_s=target),
        limit="model as an argument",
    )
    MODEL = None
    return rows + _layer_rows(reps)


def _method_rows(x, reps: int, target: float) -> list[dict]:
    rows = []
    w = jnp.ones_like(x)
    for case, model in (
        ("filter_jit(model), its method reads nothing", _Plain(w)),
        ("filter_jit(model), its method reads a global array", _ReadsTable(w)),
    ):
        runners = {
            "capture='constants'": _batch(
                boxwood.filter_jit(model, capture="constants"), x
            ),
            "captures watched (default)": _batch(boxwood.filter_jit(model), x),
        }
        rows += timing_rows(
            FIGURE, case, interleave(runners, reps=reps, target_s=target),
            limit="capture='constants'",
        )  # fmt: skip
    runners = {
        "capture='constants'": _batch(
            boxwood.filter_jit(_reads_transformed, capture="constants"), w, x
        ),
        "captures watched (default)": _batch(
            boxwood.filter_jit(_reads_transformed), w, x
        ),
    }
    rows += timing_rows(
        FIGURE,
        "helper in filter_value_and_grad reading a global array",
        interleave(runners, reps=reps, target_s=target),
        limit="capture='constants'",
    )
    return rows


def _layer_rows(reps: int) -> list[dict]:
    from boxwood._jit._capture import Layer, traced_for

    capture = traced_for(_reads_helper).capture

    def core(hidden, *args, **kwargs):
        return hidden

    class _Core:  # a compiled core that does nothing, and no C check
        call = staticmethod(core)

        def watching(self, *args):
            return None

    call = Layer(_reads_helper, capture, _Core(), hidden=True).call
    hidden = call(1.0)

    def loop(fn, *args):
        def run(n: int) -> None:
            for _ in range(n):
                fn(*args)

        return run

    runners = {
        "core called directly": loop(core, hidden, 1.0),
        "capture layer": loop(call, 1.0),
    }
    return timing_rows(
        FIGURE,
        "the layer alone (a no-op core; 2 names watched)",
        interleave(runners, reps=reps, target_s=0.02, max_calls=1_000_000),
        limit="core called directly",
        scale=1e9,
        unit="ns",
    )


# ------------------------------------------------------------- big array (child)
def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def _child(kind: str, mb: int) -> dict:
    """One first call in this (fresh) process: seconds and added peak memory."""
    big = jnp.ones((mb * 2**20 // 4,), jnp.float32)
    x = jnp.ones((), jnp.float32)
    block(big)
    if kind == "filter_jit, captured":
        fn, args = boxwood.filter_jit(lambda x: jnp.sum(big) * x), (x,)
    elif kind == "filter_jit, argument":
        fn, args = boxwood.filter_jit(lambda b, x: jnp.sum(b) * x), (big, x)
    else:  # jax.jit embeds the captured array in the executable
        fn, args = jax.jit(lambda x: jnp.sum(big) * x), (x,)
    before = _rss_kib()
    start = time.perf_counter()
    block(fn(*args))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "added_mib": max(peak - before, 0) / 1024}


KINDS = ("filter_jit, argument", "filter_jit, captured", "jax.jit, constant")


def _big_rows(quick: bool) -> list[dict]:
    reps = 1 if quick else 3
    samples: dict[str, list[dict]] = {k: [] for k in KINDS}
    for rep in range(reps):
        for kind in KINDS[rep % 3 :] + KINDS[: rep % 3]:
            out = subprocess.run(
                [sys.executable, str(Path(__file__)), kind, str(BIG_MB)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            samples[kind].append(json.loads(out.stdout.splitlines()[-1]))
    rows = []
    case = f"{BIG_MB} MB array, first call (fresh process)"
    for metric, key, unit, scale in (
        ("trace + compile", "seconds", "ms", 1e3),
        ("added peak memory", "added_mib", "MiB", 1),
    ):
        base = median([s[key] for s in samples[KINDS[0]]])
        for kind in KINDS:
            value = median([s[key] for s in samples[kind]])
            rows.append(
                row(
                    FIGURE,
                    case,
                    kind,
                    metric,
                    value * scale,
                    unit,
                    ratio=value / base if base else None,
                    ratio_to=KINDS[0],
                    reps=reps,
                    samples=[s[key] * scale for s in samples[kind]],
                )  # fmt: skip
            )
    return rows


def run(quick: bool) -> list[dict]:
    return _dispatch_rows(quick) + _big_rows(quick)


if __name__ == "__main__":  # a child of `_big_rows`
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]))))
