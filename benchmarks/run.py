"""Run boxwood's benchmarks: boxwood, raw `jax.jit` (the limit), equinox and
flax.nnx side by side, in one process.

    python benchmarks/run.py [--quick] [--only NAME,...] [--out DIR]

Writes `DIR/latest.json` (every row, with the raw samples) and `DIR/latest.md` (the
tables), and prints the tables. See benchmarks/README.md for what each figure
measures.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import boxwood  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(1, str(HERE.parent / "src"))

from _timing import row  # noqa: E402

# The figures wrap a fresh step function for each case on purpose; boxwood's warning
# about wrapping new function objects in a loop is meant for user code.
warnings.filterwarnings("ignore", message="This line has wrapped")

BENCHES = {
    "dispatch": "bench_dispatch",
    "train_step": "bench_train_step",
    "flatten": "bench_flatten",
    "async": "bench_async",
    "compile": "bench_compile",
    "memory": "bench_memory",
    "capture": "bench_capture",
    "sharding": "bench_sharding",
    "checkpoint": "bench_checkpoint",
    "display": "bench_display",
    "cold_start": "bench_cold_start",
    "models": "bench_models",
}

EXPLAIN = {
    "dispatch": "Time per call of `f(model, x) = model(x)` (tiny MLP, width 4, tanh), "
    "calls not blocked one by one. `activation in a field`: the same MLP with "
    "`jnp.tanh` held in an ordinary field of each layer (Equinox style), a "
    "non-array leaf. `typed key argument`: `f(model, x, key)` with a "
    "`jax.random.key` passed along. Ratio: to raw `jax.jit` on the flat list of the "
    "same arrays.",
    "train step": "Time per step: value-and-grad of an MSE loss + optax adam, "
    "returning the new model and optimiser state (fed into the next step). Ratio: "
    "to raw `jax.jit` over flat lists of parameters and optimiser-state leaves.",
    "train step, 3 models (seed scenario)": "Three models and three optimiser states "
    "updated in one step. Ratio: to raw `jax.jit` over flat lists.",
    "flatten/unflatten": "`jax.tree_util.tree_flatten(model)` and "
    "`treedef.unflatten(leaves)`. Ratio: to a `@dataclass` registered with "
    "`jax.tree_util.register_dataclass`.",
    "async dispatch": "Time for the call to return (the computation is still "
    "running) and to finish. Ratio: return time to `jax.jit`'s.",
    "compile time vs depth": "Trace + compile time of the first call (fresh "
    "wrapper, caches cleared). Ratio: to the same form at depth 4.",
    "data parallel, 8 devices": "Time per step of a data-parallel training step "
    "(MLP of width 32, batch 64 split over 8 simulated CPU devices, adam, parameters "
    "and optimiser state donated), run in a child process started with 8 devices "
    "and CPU asynchronous dispatch off (queued collective steps can deadlock XLA's "
    "CPU runtime on a few cores). "
    "boxwood: `filter_jit(in_shardings=..., out_shardings=...)` with prefixes from "
    "`named_shardings(..., data_parallel())`. Ratio: to `jax.jit` over flat lists "
    "with the same `NamedSharding`s.",
    "checkpoint save / load": "Saving and loading a model of about 500 MB (64 MB "
    "with `--quick`): `boxwood.save` (crash-safe: fsync and rename) and `boxwood.load` "
    "(validated, onto the device) against `safetensors.numpy.save_file` / `load_file` "
    "on the same arrays; and the time a background save takes to return. Ratio: to "
    "`safetensors.numpy` (background: its save time over safetensors' save).",
    "cold start": "Each measurement in a fresh process (round-robin repetitions). "
    "`build`: the constructor, arrays ready. `total`: from the top of the script "
    "(imports) to the end of the first training step (optax adam). `trace`, "
    "`lower`, `compile`: JAX's own durations summed over the process (in a warm "
    "restart's second process, `compile` is loading the cached executables). Each "
    "library's model code splits keys its own way: boxwood with "
    "`bw.random.split_keys` (on the host), equinox with `jax.random.split`; one "
    "row runs boxwood's with `jax.random.split` too. Ratio: to equinox (warm "
    "restart: to the first process).",
    "memory (donation)": "A training loop with the model and optimiser state "
    'donated (`filter_jit(donate="all-except-first")`, batch first and kept).',
    "captured values": "Arrays and modules read from globals or closures are "
    "inputs. Dispatch: ratio to `capture='constants'` (JAX's behaviour) and to the "
    "model passed as an argument. 200 MB array: first call in a fresh process; "
    "ratio to the array passed as an argument.",
    "pretrained models (GPT-2)": "A GPT-2-small-shaped model (124M parameters, "
    "random weights saved by `transformers`; 4 layers x 256 with `--quick`). Load: "
    "each load in a fresh process (imports not timed) followed by a read of every "
    "weight (a sum of each array); `boxwood.models.from_pretrained` of `transformers`' "
    "file (8-byte aligned: read) and of the same weights saved by boxwood (64-byte "
    "aligned: mapped) vs `transformers`' `from_pretrained` (ratio) and "
    "`safetensors.numpy.load_file` of both files; note: the load alone. Generation: "
    "greedy, 64 tokens after 32, vs `transformers` eager. Time to first token: "
    "`generate(prompt, 1)` in a fresh process after loading, compile included, then "
    "with the persistent compilation cache. Forward: 8 x 128 tokens, ratio to the "
    "same model as a plain function over a dict of arrays under `jax.jit`.",
    "display": "`Module._repr_html_` (the notebook tree) and `str(boxwood.summary(m))` "
    "on models of 10,000 array leaves; goal: under a second. Ratio: to "
    "`tree_pformat` (the text repr) of the same model.",
}


def _versions() -> dict:
    import equinox
    import flax
    import jax
    import jaxlib
    import optax

    import boxwood

    return {
        "boxwood": boxwood.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "equinox": equinox.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
    }


def _machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load,
    }


def run_benches(names: list[str], quick: bool) -> tuple[list[dict], dict, bool]:
    rows, durations, ok = [], {}, True
    for name in names:
        print(f"[{name}] running...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            module = importlib.import_module(BENCHES[name])
            rows += module.run(quick)
        except Exception as error:
            ok = False
            traceback.print_exc()
            why = f"FAILED: {type(error).__name__}: {error}".splitlines()[0]
            rows.append(row(name, "", "", "", None, "", note=why))
        durations[name] = time.perf_counter() - start
        print(f"[{name}] {durations[name]:.1f} s", file=sys.stderr, flush=True)
    return rows, durations, ok


# ------------------------------------------------------------------- markdown
def _fmt_value(value, unit: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value}"
    if isinstance(value, float):
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
        return f"{value:,.{digits}f} {unit}".strip()
    return str(value)


def _cell(r: dict) -> str:
    if r["value"] is None:
        return r["note"] or "-"
    text = _fmt_value(r["value"], r["unit"])
    if r["ratio"] is not None:
        text += f" ({r['ratio']:.2f}x)"
    return text


def _figure_table(figure: str, rows: list[dict]) -> list[str]:
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    keys = list(dict.fromkeys((r["case"], r["metric"]) for r in rows))
    cells = {(r["case"], r["metric"], r["contender"]): r for r in rows}
    first = ["case"] + (["metric"] if len(metrics) > 1 else [])
    lines = ["| " + " | ".join(first + contenders) + " |"]
    lines.append("|" + "---|" * (len(first) + len(contenders)))
    for case, metric in keys:
        label = [case] + ([metric] if len(metrics) > 1 else [])
        row = [_cell(cells[(case, metric, c)]) if (case, metric, c) in cells else ""
               for c in contenders]  # fmt: skip
        lines.append("| " + " | ".join(label + row) + " |")
    notes = sorted({r["note"] for r in rows if r["note"] and r["value"] is not None})
    lines += [""] + [f"Note: {n}" for n in notes] if notes else []
    return lines


def markdown(rows: list[dict], meta: dict) -> str:
    v, m = meta["versions"], meta["machine"]
    load = m["load_average_at_start"]
    lines = [
        f"# boxwood benchmarks ({'quick' if meta['quick'] else 'full'} mode)",
        "",
        f"{meta['date']} — {m['cpu_count']} CPUs ({m['processor']}), "
        f"load average at start {load[0]:.1f}"
        if load
        else f"{meta['date']}",
        "",
        f"boxwood {v['boxwood']}, jax {v['jax']} "
        f"({v['backend']}), equinox "
        f"{v['equinox']}, flax {v['flax']}, optax {v['optax']}, Python {v['python']}.",
        "",
        "Each cell: the median over interleaved repetitions (every contender timed "
        "in every repetition, side by side), and `(r x)`: that median divided by "
        "the limit's median. Ratios measured side by side are what matter; "
        "absolute times depend on the machine and its load. "
        "`latest.json` holds every sample.",
    ]
    for i, figure in enumerate(dict.fromkeys(r["figure"] for r in rows), 1):
        fig_rows = [r for r in rows if r["figure"] == figure]
        lines += ["", f"## {i}. {figure}", ""]
        if figure in EXPLAIN:
            lines += [EXPLAIN[figure], ""]
        lines += _figure_table(figure, fig_rows)
    total = sum(meta["durations_s"].values())
    lines += ["", f"Total benchmark time: {total:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="boxwood's benchmarks, side by side with raw jax.jit (the "
        "limit), equinox and flax.nnx."
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--only", default="", help=f"comma-separated: {','.join(BENCHES)}"
    )
    parser.add_argument("--out", default=str(HERE / "results"), help="output folder")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        "quick": args.quick,
        "only": names,
        "machine": _machine(),
        "versions": _versions(),
    }
    rows, meta["durations_s"], ok = run_benches(names, args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, meta)
    (out / "latest.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "latest.md").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
