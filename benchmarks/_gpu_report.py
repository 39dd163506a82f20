"""The output of `benchmarks/gpu.py`: derived rows (MFU against the measured
peak, tokens compared between contenders) and the markdown table, one line per
(figure, case, metric) with the contenders side by side."""

from __future__ import annotations

from _gpu_cases import GENERATE, LOAD, TRAIN, train_cases

CONTENDERS = ("boxwood", "transformers eager", "transformers torch.compile")
_LIBS = {"boxwood": "boxwood", "eager": CONTENDERS[1], "compile": CONTENDERS[2]}
_TASK_FIGURES = {"train": TRAIN, "generate": GENERATE, "load": LOAD}
FIGURES = (TRAIN, GENERATE, LOAD)
METRICS = (
    "tokens/s",
    "MFU",
    "step time",
    "first step, cold",
    "first step, persistent cache",
    "first step (eager: no compile)",
    "time to first token, fresh process, cold",
    "time to first token, fresh process, persistent cache",
    "time to first token, warm",
    "load onto the device",
    "error",
    "skipped",
)


def _peak(rows: list[dict], meta: dict) -> float | None:
    peaks = {
        r["contender"]: r["value"]
        for r in rows
        if r["figure"].startswith("bf16 matmul")
    }
    meta["peak_tflops"] = {k: float(f"{v:.4g}") for k, v in peaks.items() if v}
    return max(meta["peak_tflops"].values()) if meta["peak_tflops"] else None


def _mfu_rows(rows: list[dict], peak: float | None) -> list[dict]:
    """MFU of every training tokens/s row: model FLOPs per token (from boxwood's
    parameter count of the same model) x tokens/s over the measured peak."""
    flops = {r["case"]: r["flops_per_token"] for r in rows if r.get("flops_per_token")}
    out = []
    for r in rows:
        if r["figure"] != TRAIN or r["metric"] != "tokens/s" or r["value"] is None:
            continue
        per_token = flops.get(r["case"])
        if per_token is None or not peak:
            continue
        achieved = r["value"] * per_token / 1e12
        out.append(dict(r, metric="MFU", value=100 * achieved / peak, unit="%", samples=None,
                        note=f"{achieved:.3g} TFLOP/s of model FLOPs / {peak:.3g} peak"))  # fmt: skip
    return out


def _compare_tokens(rows: list[dict]) -> None:
    """Note, on boxwood's generation rows, how many new tokens equal PyTorch's."""
    theirs = {r["case"]: r["tokens"] for r in rows
              if r.get("tokens") and r["contender"] == CONTENDERS[1]}  # fmt: skip
    for r in rows:
        if r.get("tokens") and r["contender"] == "boxwood" and r["case"] in theirs:
            a, b = r["tokens"], theirs[r["case"]]
            same = next(
                (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))
            )
            r["note"] = (f"row 0's tokens equal to PyTorch's ({same} of {len(a)})" if same == len(a)
                         else f"row 0 equals PyTorch's for {same} of {len(a)} tokens (bf16)")  # fmt: skip


def _note_callbacks(rows: list[dict]) -> None:
    """Say, beside a first step from the persistent cache, when the step holds a
    host callback (then JAX compiles it again instead of reading it)."""
    found = {r["case"]: r["host_callbacks"] for r in rows if r.get("host_callbacks")}
    for r in rows:
        if r["metric"] == "first step, persistent cache" and r["case"] in found:
            r["note"] += f"; host callback in the step: {', '.join(found[r['case']])}"


def finish(rows: list[dict], meta: dict) -> list[dict]:
    """Fills the derived rows and the run's labels (loss, casting) into `meta`."""
    for r in rows:
        task = r.get("task") or {}
        r["figure"] = _TASK_FIGURES.get(r["figure"], r["figure"])
        r["contender"] = _LIBS.get(r["contender"], r["contender"])
        if task.get("case") and r["case"] == task["case"]:
            r["case"] = train_cases(meta["quick"])[task["case"]].title
    _note_callbacks(rows)
    peak = _peak(rows, meta)
    rows = rows + _mfu_rows(rows, peak)
    _compare_tokens(rows)
    for key in ("loss", "cast"):
        meta[key] = sorted({r[key] for r in rows if r.get(key)})
    return rows


def _format(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "tok/s":
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    return f"{value:.3g} {unit}"


def _header(meta: dict) -> list[str]:
    lines = [f"# benchmarks/gpu.py on {meta.get('backend', '?')} "
             f"({meta.get('device_kind', '?')}), {meta['date']}", ""]  # fmt: skip
    load = meta["load_average_start"][0]
    if meta["quick"]:
        lines.append(
            "**Quick run: tiny configs that check the script; these are not results.**"
        )
    if load > 0.5 * (meta["cores"] or 1):
        lines.append(f"**Busy machine (load {load:.1f} on {meta['cores']} cores): the figures "
                     "are not results.**")  # fmt: skip
    if meta.get("label"):
        lines.append(f"**{meta['label']}**")
    cuda = (
        ", ".join(f"{k} {v}" for k, v in meta.get("jax_cuda_plugins", {}).items())
        or "none"
    )
    lines += [
        "",
        f"- JAX {meta.get('jax')}, jaxlib {meta.get('jaxlib')}; JAX's CUDA plugins: {cuda}; "
        f"platform: {str(meta.get('platform_version')).splitlines()[0] if meta.get('platform_version') else '?'}",
        f"- torch {meta.get('torch', 'not installed')} (CUDA {meta.get('torch_cuda')}, "
        f"cuDNN {meta.get('cudnn')}), transformers {meta.get('transformers')}; torch threads "
        f"{meta.get('torch_threads')}, XLA's CPU threads {meta.get('xla_threads')}"
        + (f"; torch.compile {meta['torch_compile']}" if meta.get("torch_compile") else ""),
        f"- bf16 matmul peak (TFLOP/s, measured): {meta.get('peak_tflops')}; MFU uses the larger",
        f"- boxwood loss: {'; '.join(meta['loss']) or '?'}; bf16 parameters: "
        f"{'; '.join(meta['cast']) or '?'}",
        f"- commit {meta['commit']}; {meta['reps']} repetitions, medians; one fresh process per "
        f"contender; wall {meta['wall_s']} s",
    ]  # fmt: skip
    return lines + [f"- {name} failed: `{err.splitlines()[-1][:200]}`"
                    for name, err in meta["errors"].items()]  # fmt: skip


def _order(rows: list[dict]) -> list[tuple[str, str, str]]:
    keys: list[tuple[str, str, str]] = []
    for r in rows:
        key = (r["figure"], r["case"], r["metric"])
        if r["figure"] in FIGURES and key not in keys:
            keys.append(key)
    cases = [k[1] for k in keys]
    return sorted(keys, key=lambda k: (FIGURES.index(k[0]), cases.index(k[1]),
                                       METRICS.index(k[2]) if k[2] in METRICS else 99))  # fmt: skip


def markdown(rows: list[dict], meta: dict) -> str:
    lines = _header(meta) + ["", "| figure | case | metric | " + " | ".join(CONTENDERS)
                             + " | boxwood / eager | load (1 min) | notes |",
                             "|---" * (len(CONTENDERS) + 6) + "|"]  # fmt: skip
    for figure, case, metric in _order(rows):
        cell = {r["contender"]: r for r in rows
                if (r["figure"], r["case"], r["metric"]) == (figure, case, metric)}  # fmt: skip
        values = [
            _format(cell[c]["value"], cell[c]["unit"]) if c in cell else ""
            for c in CONTENDERS
        ]
        ours, eager = cell.get("boxwood"), cell.get(CONTENDERS[1])
        ratio = ""
        if ours and eager and ours["value"] and eager["value"]:
            ratio = f"{ours['value'] / eager['value']:.2f}x"
        loads = "/".join(f"{cell[c]['load_average'][0]:.1f}" for c in CONTENDERS
                         if c in cell and cell[c].get("load_average"))  # fmt: skip
        notes = "; ".join(f"{c}: {cell[c]['note']}" for c in CONTENDERS
                          if c in cell and cell[c].get("note"))  # fmt: skip
        lines.append(f"| {figure} | {case} | {metric} | " + " | ".join(values)
                     + f" | {ratio} | {loads} | {notes} |")  # fmt: skip
    return "\n".join(lines)
