"""`choose_remat`: the fastest rematerialisation policy (and, when asked, way of
looping over the blocks) whose compiled step fits the device's memory, and
`RematChoice`, what it measured and why it chose."""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._jit import filter_jit
from .._warnings import user_stacklevel
from ..nn import Stacked

# The candidates, fewest recomputations first: nothing recomputed; every
# matrix product without batch dimensions kept (the rest recomputed); each
# block recomputed whole.
POLICIES = ("none", "dots_with_no_batch_dims_saveable", "full")


def _label(policy: str, unroll: int | bool | None) -> str:
    return policy if unroll is None else f"{policy}, unroll={unroll}"


@dataclasses.dataclass(frozen=True)
class RematRow:
    """One candidate of [`boxwood.models.choose_remat`][]: its remat `policy`,
    its compiled step's memory (`peak_bytes`: temporaries + arguments + outputs
    - aliased, from `memory_analysis()`; `None` where the compiler gave none),
    whether it fits, its compile time, the median time of a step (`None` where
    it was not run: it does not fit, or its compile failed), the error of a
    failed compile or run, and its `unroll` (`None`: the model's own, where
    `choose_remat` was given no `unrolls`)."""

    policy: str
    peak_bytes: int | None
    temp_bytes: int | None
    fits: bool
    compile_seconds: float | None
    step_seconds: float | None
    error: str | None = None
    unroll: int | bool | None = None

    @property
    def label(self) -> str:
        """The candidate's name: its policy, and its `unroll` where one was set."""
        return _label(self.policy, self.unroll)


@dataclasses.dataclass(frozen=True)
class RematChoice:
    """What [`boxwood.models.choose_remat`][] measured and chose: `policy` (as
    `with_remat` takes it: `"none"`, a `jax.checkpoint_policies` name or
    `"full"`), `reason` (a sentence), `rows` (one
    [`boxwood.models.RematRow`][] per candidate), the memory limit it held the
    steps to (`limit_bytes`, `None`: the device reports none) and `margin`.
    `str(choice)` is a table. `unroll` is the chosen `with_unroll` setting
    (`None`: the model's own, where `choose_remat` was given no `unrolls`).

    `choice.apply(tree)` gives `tree` with every `boxwood.nn.Stacked` in it set
    to the chosen policy (and unroll): an optimiser state built from the model
    before the choice holds the model's structure, remat setting included, and
    must be converted (or built anew from the returned model)."""

    policy: str
    reason: str
    rows: tuple[RematRow, ...]
    limit_bytes: int | None
    margin: float
    unroll: int | bool | None = None

    def apply(self, tree: Any) -> Any:
        """`tree` (an optimiser state, a model) with every `boxwood.nn.Stacked`
        in it set to `policy` (and `unroll`); its arrays are shared."""
        return with_policy(tree, self.policy, self.unroll)

    def __str__(self) -> str:
        gib = float(1 << 30)

        def size(n: int | None) -> str:
            if n is None:
                return "?"
            return f"{n / gib:.2f} GiB" if n >= gib else f"{n / (1 << 20):.2f} MiB"

        limit = (
            "no limit reported"
            if self.limit_bytes is None
            else f"limit {size(self.limit_bytes)}, margin {self.margin:.0%}"
        )
        lines = [f"remat {_label(self.policy, self.unroll)!r}: {self.reason} ({limit})"]
        for r in self.rows:
            peak = size(r.peak_bytes)
            step = "-" if r.step_seconds is None else f"{r.step_seconds * 1e3:.2f} ms"
            fits = "fits" if r.fits else "does not fit"
            extra = f"; {r.error}" if r.error else ""
            lines.append(f"  {r.label:<34} {peak:>10} {fits:<12} step {step}{extra}")
        return "\n".join(lines)


def with_policy(tree: Any, policy: str, unroll: int | bool | None = None) -> Any:
    """`tree` with every `Stacked` in it (a model's blocks, or the same
    structure in an optimiser state) rematerialised as `policy` says, and looped
    over as `unroll` says (`None`: as it is)."""
    remat = None if policy == "none" else policy

    def convert(x: Any) -> Any:
        if not isinstance(x, Stacked):
            return x
        x = x.with_remat(remat)
        return x if unroll is None else x.with_unroll(unroll)

    return jax.tree.map(convert, tree, is_leaf=lambda x: isinstance(x, Stacked))


def _device_limit() -> int | None:
    """The first local device's memory (`bytes_limit`), `None` where it reports
    none (a CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    if not stats:
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def _peak(compiled: Any) -> tuple[int | None, int | None]:
    stats = compiled.memory_analysis()
    if stats is None:
        return None, None

    def size(name: str) -> int:
        return int(getattr(stats, f"{name}_size_in_bytes", 0) or 0)

    temp = size("temp")
    return temp + size("argument") + size("output") - size("alias"), temp


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def _time(compiled: Any, args: tuple, repeats: int) -> float:
    """The median seconds of `repeats` calls after one untimed call."""
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(
    jitted: Any, candidate: tuple, args: tuple, budget: float | None, repeats: int
) -> RematRow:
    """Compile `jitted` for `args`, and run it if its memory is within `budget`;
    `candidate` is `(policy, unroll)`."""
    policy, unroll = candidate
    start = time.perf_counter()
    try:
        compiled = jitted.lower(*args).compile()
    except Exception as error:  # noqa: BLE001 - e.g. too large for the device
        return RematRow(
            policy, None, None, False, None, None, _first_line(error), unroll
        )
    seconds = time.perf_counter() - start
    peak, temp = _peak(compiled)
    fits = budget is None or peak is None or peak <= budget
    step_seconds, error = None, None
    if fits:
        try:
            step_seconds = _time(compiled, args, repeats)
        except Exception as failure:  # noqa: BLE001 - out of memory when run
            fits, error = False, _first_line(failure)
    return RematRow(policy, peak, temp, fits, seconds, step_seconds, error, unroll)


def _decide(
    rows: list[RematRow], budget: float | None, limit: int | None, margin: float
) -> tuple[RematRow, str]:
    """The fastest row that ran, and why; without one, the smallest (warned)."""
    timed = [r for r in rows if r.step_seconds is not None]
    if timed:
        best = min(timed, key=lambda r: r.step_seconds or 0.0)
        others = ", ".join(
            f"{r.label} {(r.step_seconds or 0.0) * 1e3:.2f} ms"
            for r in timed
            if r is not best
        )
        reason = (
            f"the fastest step that fits ({(best.step_seconds or 0.0) * 1e3:.2f} ms"
        )
        reason += f"; {others})" if others else ")"
        left_out = [r.label for r in rows if not r.fits]
        if left_out:
            reason += f"; {', '.join(left_out)} did not fit or failed"
        return best, reason
    measured = [r for r in rows if r.peak_bytes is not None]
    if not measured:
        raise RuntimeError(
            "choose_remat: no policy compiled: "
            + "; ".join(f"{r.label}: {r.error}" for r in rows)
        )
    best = min(measured, key=lambda r: r.peak_bytes or 0)
    warnings.warn(
        f"choose_remat: no remat policy's step fits in {budget or 0:.4g} bytes "
        f"({1 - margin:.0%} of {limit} bytes): returning the model with "
        f"{best.label!r}, the smallest ({best.peak_bytes} bytes). Reduce the "
        "batch or the sequence length, or pass a larger `memory_limit`.",
        stacklevel=user_stacklevel(),
    )
    return best, "no policy fits; the one with the smallest memory"


def choose_remat(
    step: Callable[..., Any],
    model: Any,
    *args: Any,
    policies: Sequence[str] = POLICIES,
    unrolls: Sequence[int | bool] | None = None,
    memory_limit: int | None = None,
    margin: float = 0.1,
    repeats: int = 3,
) -> tuple[Any, RematChoice]:
    """Compile `step(model.with_remat(policy), *args)` for each policy, keep
    those whose compiled memory fits the device with a margin, run each of
    those `repeats` times, and return the model with the fastest (with
    `unrolls`, each policy is tried with each way of looping over the blocks):

    ```python
    model, choice = bm.choose_remat(loss_and_grads, model, batch, key)
    print(choice)  # each policy's memory and step time, and why it won
    ```

    Which policy is fastest is not obvious from outside: keeping every
    activation (`"none"`) recomputes nothing but moves the most memory, and a
    step that keeps the matrix products only can be faster; which of them fits
    depends on the batch. The step is compiled and run as given, with the
    arguments given (not donated: their memory is counted in full), so take a
    step without the optimiser update, or with it, as long as it does not
    change its arguments in place. An optimiser state among the arguments
    holds the model's structure, its remat setting included: each candidate
    gets it converted, and `choice.apply(opt_state)` converts yours to the
    chosen policy (or build it from the returned model). Each candidate costs a
    compile and `repeats + 1` runs.

    **Arguments:**

    - `step`: a function `step(model, *args)` (plain or already
      `boxwood.filter_jit`-ed; it is compiled here with `filter_jit` and
      without donation). Put the model first: `lambda m, state, ids:
      train_step(ids, m, state)` for a step that takes it elsewhere.
    - `model`: anything with `with_remat` (every `boxwood.models` model,
      `boxwood.nn.Stacked`).
    - `*args`: the step's other arguments, real arrays (each candidate runs).
    - `policies`: the candidates, in `with_remat`'s terms (`"none"` is no
      remat, `"full"` recomputes each block, any `jax.checkpoint_policies` name);
      by default none, `"dots_with_no_batch_dims_saveable"` and full. (Keyword
      only, as are the rest.)
    - `unrolls`: `with_unroll` settings to try each policy with, such as
      `(1, True)`: scanned blocks, and blocks in a Python loop (on a TPU v5e the
      latter made GPT-2-small's step 6% faster with 20% fewer temporaries, at 4x
      the compile; docs/models.md). By default the model's own, not varied.
    - `memory_limit`: the bytes a step may take; by default the device's
      (`memory_stats()["bytes_limit"]` of the first local device; a CPU
      reports none, and then every policy fits).
    - `margin`: the share of the limit left free (default 0.1: a step must
      fit in 90% of it).
    - `repeats`: timed runs per candidate (the median is compared).

    **Returns:** `(model, choice)`: the model with the chosen policy, and a
    [`boxwood.models.RematChoice`][] saying what each candidate took and why
    the policy was chosen. Where no candidate fits, the one with the smallest
    memory is returned, with a warning.
    """
    if not policies:
        raise ValueError("choose_remat: `policies` is empty; give at least one.")
    if unrolls is not None and (isinstance(unrolls, (int, bool)) or not unrolls):
        raise ValueError(
            f"choose_remat: `unrolls` must be a non-empty sequence of `with_unroll` "
            f"settings, such as (1, True), got {unrolls!r}."
        )
    if not 0 <= margin < 1:
        raise ValueError(f"choose_remat: `margin` must be in [0, 1), got {margin!r}.")
    needs = ("with_remat",) if unrolls is None else ("with_remat", "with_unroll")
    for method in needs:
        if not hasattr(model, method):
            raise TypeError(
                f"choose_remat: `model` must have `{method}` (a boxwood.models "
                f"model or a boxwood.nn.Stacked), got {type(model).__name__}."
            )
    limit = _device_limit() if memory_limit is None else int(memory_limit)
    budget = None if limit is None else limit * (1 - margin)

    # a plain function around `step`: `step` may be a `filter_jit` wrapper
    # itself, whose donation must not apply (it is traced inside this one)
    def call(*arguments: Any) -> Any:
        return step(*arguments)

    jitted = filter_jit(call)
    rows, models = [], []  # (a list: `True == 1`, so not a dict keyed by unroll)
    for unroll in (None,) if unrolls is None else unrolls:
        for policy in policies:
            candidate = model.with_remat(None if policy == "none" else policy)
            if unroll is not None:
                candidate = candidate.with_unroll(unroll)
            models.append(candidate)
            # an optimiser state among the arguments holds the model's structure
            same = (candidate, *with_policy(args, policy, unroll))
            rows.append(_measure(jitted, (policy, unroll), same, budget, repeats))
    best, reason = _decide(rows, budget, limit, margin)
    choice = RematChoice(best.policy, reason, tuple(rows), limit, margin, best.unroll)
    return models[next(i for i, r in enumerate(rows) if r is best)], choice
