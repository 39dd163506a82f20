"""Timing helpers of `benchmarks/accelerator.py` and `train_curve.py`:
repetitions with medians, steps per repetition calibrated to a target time, and
JAX's own compile events (`jax.monitoring`) around a first call."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

# `jax.monitoring` event -> short name. `compile` includes reading an executable
# from the persistent cache; hits and misses count the cache's answers; `programs`
# counts backend compiles (a program the cache is not asked about, such as one
# holding a host callback, is compiled without a hit or a miss).
_DURATIONS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read",
}
_COUNTS = {
    "/jax/compilation_cache/cache_hits": "cache_hits",
    "/jax/compilation_cache/cache_misses": "cache_misses",
}
_ACTIVE: list[dict] = []
_LISTENING: list[bool] = []


def _listen() -> None:
    if _LISTENING:
        return
    import jax

    def duration(event: str, duration_secs: float, **_: Any) -> None:
        for totals in _ACTIVE:
            if event in _DURATIONS:
                totals[_DURATIONS[event]] += duration_secs
            if _DURATIONS.get(event) == "compile":
                totals["programs"] += 1

    def count(event: str, **_: Any) -> None:
        for totals in _ACTIVE:
            if event in _COUNTS:
                totals[_COUNTS[event]] += 1

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(count)
    _LISTENING.append(True)


class Compiles:
    """`with Compiles() as c:` sums JAX's trace, lowering and compile durations
    and the persistent cache's hits and misses inside the block."""

    def __init__(self) -> None:
        names = [*_DURATIONS.values(), *_COUNTS.values(), "programs"]
        self.totals: dict[str, float] = dict.fromkeys(names, 0.0)

    def __enter__(self) -> Compiles:
        _listen()
        _ACTIVE.append(self.totals)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self.totals)

    def fields(self) -> dict[str, float]:
        return {f"jax_{k}": v for k, v in self.totals.items()}

    def note(self) -> str:
        t = self.totals
        text = f"trace {t['trace']:.2f} s, lower {t['lower']:.2f} s, XLA compile {t['compile']:.2f} s"
        hits, misses = int(t["cache_hits"]), int(t["cache_misses"])
        text += f"; {int(t['programs'])} program(s) compiled"
        if hits or misses:
            text += f", cache hits {hits}, misses {misses}"
        unasked = int(t["programs"]) - hits - misses
        if unasked > 0 and _cache_on():
            text += f", {unasked} compiled without the cache (as JAX does for host callbacks)"
        return text


def _cache_on() -> bool:
    import jax

    return bool(getattr(jax.config, "jax_compilation_cache_dir", None))


def timed(fn: Callable[[], object]) -> float:
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def repeat(run: Callable[[], object], reps: int) -> float:
    """Median seconds of `run()` over `reps` calls (after the caller's warm-up)."""
    return statistics.median(timed(run) for _ in range(reps))


def steady_time(
    run: Callable[[int], object], reps: int, target_s: float, max_steps: int = 50
) -> tuple[float, list[float]]:
    """Seconds per step of `run(n)` (n steps, blocked once at the end): one warm
    step, `n` chosen so a repetition takes about `target_s`, then `reps`
    repetitions. Returns the median and the per-repetition samples."""
    run(1)
    probe = timed(lambda: run(2)) / 2
    n = int(min(max(target_s / max(probe, 1e-6), 2), max_steps))
    samples = []
    for _ in range(reps):
        gc.collect()
        samples.append(timed(lambda: run(n)) / n)
    return statistics.median(samples), samples
