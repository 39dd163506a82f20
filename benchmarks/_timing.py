"""Interleaved timing: every contender is timed in every repetition, side by side.

A contender is a *batch runner*, `run(n)`: it makes `n` calls and blocks once at the
end (so asynchronous dispatch is kept inside the batch). Repetitions are
round-robin (for each repetition, each contender runs one batch), starting from a
different contender each repetition, so slow drifts of a noisy machine hit every
contender alike. Garbage collection is off during a batch.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import jax

Runner = Callable[[int], object]


def block(tree) -> None:
    """Wait for every array in `tree`."""
    jax.block_until_ready(tree)


def timed(fn: Callable, *args) -> float:
    """Seconds taken by `fn(*args)`, with the garbage collector off."""
    gc.disable()
    try:
        start = time.perf_counter()
        fn(*args)
        return time.perf_counter() - start
    finally:
        gc.enable()


def calibrate(run: Runner, target_s: float, min_calls: int, max_calls: int) -> int:
    """How many calls make a batch of about `target_s` seconds (after a warm-up)."""
    run(2)
    probe = 4
    elapsed = timed(run, probe)
    while elapsed < 0.01 and probe < max_calls:
        probe *= 4
        elapsed = timed(run, probe)
    per_call = max(elapsed / probe, 1e-9)
    return int(min(max(target_s / per_call, min_calls), max_calls))


def interleave(
    runners: dict[str, Runner],
    *,
    reps: int,
    target_s: float,
    min_calls: int = 5,
    max_calls: int = 100_000,
) -> dict[str, dict]:
    """Time each runner in `reps` round-robin repetitions.

    **Returns:** for each runner, `{"calls": n, "samples": [seconds per call, one
    per repetition]}`. Every runner is warmed up (compiled) and calibrated first.
    """
    calls = {
        name: calibrate(run, target_s, min_calls, max_calls)
        for name, run in runners.items()
    }
    names = list(runners)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        gc.collect()
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            n = calls[name]
            samples[name].append(timed(runners[name], n) / n)
    return {name: {"calls": calls[name], "samples": samples[name]} for name in names}


def interleave_once(
    runners: dict[str, Callable[[], dict]], *, reps: int, warmup: int = 1
) -> dict:
    """Round-robin repetitions of runners that measure themselves: each call returns
    a dict of named durations (seconds). Each runner first runs `warmup` times
    unrecorded. **Returns:** `{name: {metric: [samples]}}`.
    """
    names = list(runners)
    for run in runners.values():
        for _ in range(warmup):
            run()
    out: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for rep in range(reps):
        gc.collect()
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            gc.disable()
            try:
                measured = runners[name]()
            finally:
                gc.enable()
            for metric, value in measured.items():
                out[name].setdefault(metric, []).append(value)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_ratio(samples: list[float], limit: list[float]) -> float:
    """Median over repetitions of `sample / limit` in the same repetition."""
    return statistics.median(s / lim for s, lim in zip(samples, limit))


def row(
    figure: str,
    case: str,
    contender: str,
    metric: str,
    value: float | int | str | None,
    unit: str,
    *,
    ratio: float | None = None,
    ratio_to: str | None = None,
    note: str = "",
    **extra,
) -> dict:
    """One result row (the JSON and markdown outputs are lists of these)."""
    return {
        "figure": figure,
        "case": case,
        "contender": contender,
        "metric": metric,
        "value": value,
        "unit": unit,
        "ratio": ratio,
        "ratio_to": ratio_to,
        "note": note,
        **extra,
    }


def timing_rows(
    figure: str,
    case: str,
    results: dict[str, dict],
    *,
    limit: str,
    metric: str = "time per call",
    scale: float = 1e6,
    unit: str = "us",
) -> list[dict]:
    """Rows for the output of `interleave`. `ratio` is the contender's median over
    the `limit` runner's median; `paired_ratio` (JSON only) is the median of the
    per-repetition ratios."""
    rows = []
    base = results[limit]["samples"]
    for name, res in results.items():
        rows.append(
            row(
                figure,
                case,
                name,
                metric,
                median(res["samples"]) * scale,
                unit,
                ratio=median(res["samples"]) / median(base),
                ratio_to=limit,
                paired_ratio=paired_ratio(res["samples"], base),
                calls=res["calls"],
                reps=len(res["samples"]),
                samples=[s * scale for s in res["samples"]],
            )
        )
    return rows


def skipped_row(
    figure: str, case: str, contender: str, why: str, metric: str = "time per call"
) -> dict:
    return row(figure, case, contender, metric, None, "us", note=why)
