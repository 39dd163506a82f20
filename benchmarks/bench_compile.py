"""Figure 5, compile time in depth: trace + compile time (the first call of a fresh
wrapper, with `jax.clear_caches()` before it) for a stack of identical layers.

- *scan*: the layers are stored stacked and applied with a scan
  (`boxwood.nn.Stacked`, or `boxwood.filter_scan` directly if `Stacked` is not
  available): the program holds one layer whatever the depth.
- *unrolled*: a tuple of layers applied in a Python loop: the program grows with
  the depth.

The ratio reported is compile time at depth 64 / at depth 4, for each form.
"""

from __future__ import annotations

import gc
import time

import jax
import jax.numpy as jnp
import jax.random as jr

import boxwood
from _models import BwLinear, BwMLP
from _timing import median, paired_ratio, row

FIGURE = "compile time vs depth"
WIDTH = 32
DEPTHS = (4, 64)


class ScanStack(boxwood.Module):
    """Layers with stacked arrays, applied with `boxwood.filter_scan` (the fallback
    when `boxwood.nn.Stacked` is not available)."""

    layers: BwLinear

    def __call__(self, x):
        out, _ = boxwood.filter_scan(lambda h, layer: (layer(h), None), x, self.layers)
        return out


def _layer(key) -> BwLinear:
    w = jr.normal(key, (WIDTH, WIDTH)) / jnp.sqrt(WIDTH)
    return BwLinear(w, jnp.zeros(WIDTH))


def _scanned(depth: int) -> tuple[object, str]:
    key = jr.key(depth)
    try:
        from boxwood.nn import Stacked
    except ImportError:
        keys = jr.split(key, depth)
        return ScanStack(jax.vmap(_layer)(keys)), "boxwood.filter_scan"
    return Stacked(_layer, depth, key=key), "boxwood.nn.Stacked"


def _unrolled(depth: int) -> BwMLP:
    return BwMLP(tuple(_layer(k) for k in jr.split(jr.key(depth), depth)))


def _apply(model, x):
    return model(x)


def _first_call_time(model, x) -> float:
    """Seconds for the first call of a fresh `filter_jit` wrapper, caches cleared."""
    fn = boxwood.filter_jit(_apply)
    fn.clear_cache()  # wrappers of the same function share compiled code
    jax.clear_caches()
    gc.disable()
    try:
        start = time.perf_counter()
        jax.block_until_ready(fn(model, x))
        return time.perf_counter() - start
    finally:
        gc.enable()


def run(quick: bool) -> list[dict]:
    reps = 3 if quick else 7
    x = jnp.linspace(-1.0, 1.0, WIDTH)
    cases, how = {}, ""
    for depth in DEPTHS:
        cases[("scan", depth)], how = _scanned(depth)
        cases[("unrolled", depth)] = _unrolled(depth)
    samples: dict[tuple, list[float]] = {case: [] for case in cases}
    names = list(cases)
    for rep in range(reps):  # round-robin, rotating the starting case
        gc.collect()
        for case in names[rep % len(names) :] + names[: rep % len(names)]:
            samples[case].append(_first_call_time(cases[case], x))
    rows = []
    for form in ("scan", "unrolled"):
        contender = f"scan ({how})" if form == "scan" else "unrolled (Python loop)"
        shallow = samples[(form, DEPTHS[0])]
        for depth in DEPTHS:
            s = samples[(form, depth)]
            ratio = median(s) / median(shallow)
            rows.append(
                row(
                    FIGURE,
                    f"depth {depth} (width {WIDTH})",
                    contender,
                    "trace + compile",
                    median(s) * 1e3,
                    "ms",
                    ratio=ratio,
                    ratio_to=f"depth {DEPTHS[0]}",
                    paired_ratio=paired_ratio(s, shallow),
                    reps=reps,
                    samples=[v * 1e3 for v in s],
                )
            )
    return rows
