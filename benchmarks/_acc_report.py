"""The output of `benchmarks/accelerator.py`: derived rows (MFU against the
measured matmul peak, the tokens/s a step would reach at that peak, generated
tokens compared) and the markdown tables, one line per (case, metric) with the
contenders side by side and boxwood's figure over its pure-JAX peer's; the
unrolled boxwood step's rows say their figure over the scanned step's."""

from __future__ import annotations

from _acc_cases import CONTENDERS, DEVICE, GENERATE, LIBS, MEMORY, TRAIN

UNROLLED = LIBS["boxwood_unrolled"]

FIGURES = (DEVICE, TRAIN, GENERATE, MEMORY)
METRICS = (
    "tokens/s",
    "MFU",
    "step time",
    "first step, cold",
    "first step, cold, BOXWOOD_ON_ERROR=nan",
    "first step, persistent cache, BOXWOOD_ON_ERROR=nan",
    "first step, persistent cache",
    "first call (compile included)",
    "error",
    "skipped",
)


def _peak(rows: list[dict], meta: dict) -> float | None:
    found = [
        r["value"] for r in rows if r["figure"] == DEVICE and r["metric"] == "TFLOP/s"
    ]
    meta["peak_tflops"] = round(found[0], 2) if found and found[0] else None
    return meta["peak_tflops"]


def _derived(rows: list[dict], peak: float | None) -> list[dict]:
    """MFU of every training tokens/s row, and the bound: the tokens/s at the
    measured peak."""
    out = []
    seen = set()
    for r in rows:
        if r["figure"] != TRAIN or r["metric"] != "tokens/s" or r["value"] is None:
            continue
        per_token = r.get("flops_per_token")
        if not per_token or not peak:
            continue
        achieved = r["value"] * per_token / 1e12
        out.append(dict(r, metric="MFU", value=100 * achieved / peak, unit="%", samples=None,
                        note=f"{achieved:.3g} TFLOP/s of model FLOPs"))  # fmt: skip
        if r["case"] not in seen:
            seen.add(r["case"])
            out.append(dict(r, contender="bound", value=peak * 1e12 / per_token, samples=None,
                            note=f"at the measured peak, {per_token / 1e9:.3g} GFLOP a token"))  # fmt: skip
    return out


def _compare_tokens(rows: list[dict]) -> None:
    """Note, on boxwood's generation rows, how many of row 0's new tokens equal
    the pure-JAX loop's (bfloat16: they may part after a near tie)."""
    theirs = {r["case"]: r["tokens"] for r in rows
              if r.get("tokens") and r["contender"] == "pure JAX"}  # fmt: skip
    for r in rows:
        if r.get("tokens") and r["contender"] == "boxwood" and r["case"] in theirs:
            a, b = r["tokens"], theirs[r["case"]]
            same = next(
                (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))
            )
            r["note"] = (
                f"row 0: first {same} of {len(a)} new tokens equal to pure JAX's"
            )


def _compare_unrolled(rows: list[dict]) -> None:
    """Note, on the unrolled boxwood step's rows, their figure over boxwood's
    scanned step's (the same case and metric)."""
    scanned = {(r["case"], r["metric"]): r["value"] for r in rows
               if r["figure"] == TRAIN and r["contender"] == "boxwood"}  # fmt: skip
    for r in rows:
        base = scanned.get((r["case"], r["metric"]))
        if r["contender"] != UNROLLED or not base or not r["value"]:
            continue
        ratio = f"{r['value'] / base:.2f}x the scanned step's"
        r["note"] = f"{ratio}; {r['note']}" if r.get("note") else ratio


def finish(rows: list[dict], meta: dict) -> list[dict]:
    peak = _peak(rows, meta)
    rows = rows + _derived(rows, peak)
    _compare_tokens(rows)
    _compare_unrolled(rows)
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
    if unit == "GiB":
        return f"{value:.2f} GiB"
    return f"{value:.4g} {unit}"


def _header(meta: dict) -> list[str]:
    lines = [f"# benchmarks/accelerator.py on {meta.get('device_kind', '?')} "
             f"({meta.get('backend', '?')}), {meta['date']}", ""]  # fmt: skip
    if meta["quick"]:
        lines.append(
            "**Quick run: tiny configs that check the script; these are not results.**"
        )
    load = meta["load_average_start"][0]
    if meta.get("backend") == "cpu" and load > 0.5 * (meta["cores"] or 1):
        lines.append(f"**Busy machine (load {load:.1f} on {meta['cores']} cores): the figures "
                     "are not results.**")  # fmt: skip
    if meta.get("label"):
        lines.append(f"**{meta['label']}**")
    lines += [
        "",
        f"- JAX {meta.get('jax')}, jaxlib {meta.get('jaxlib')}, libtpu {meta.get('libtpu')}; "
        f"flax {meta.get('flax')}, equinox {meta.get('equinox')}, optax {meta.get('optax')}; "
        f"devices {meta.get('devices')}",
        f"- attention: {meta['attention']}; remat policy: {meta['remat']}; "
        f"bf16 matmul peak (measured): {meta.get('peak_tflops')} TFLOP/s, MFU against it",
        f"- commit {meta['commit']}; {meta['reps']} repetitions, medians; one fresh process "
        f"per contender; load average at the start {meta['load_average_start']}; "
        f"wall {meta['wall_s']} s",
        "- ratio: boxwood's figure over pure JAX's (tokens/s: above 1 is faster; "
        "times and bytes: below 1 is better); the column 'boxwood, unrolled' is "
        "boxwood's step with `with_unroll(True)` (no scan over the blocks), its "
        "notes its figure over the scanned step's",
    ]
    return lines + [f"- {name} failed: `{err.splitlines()[-1][:200]}`"
                    for name, err in meta["errors"].items()]  # fmt: skip


def _keys(rows: list[dict], figure: str) -> list[tuple[str, str]]:
    keys: list[tuple[str, str]] = []
    for r in rows:
        if r["figure"] == figure and (r["case"], r["metric"]) not in keys:
            keys.append((r["case"], r["metric"]))
    cases = [k[0] for k in keys]
    return sorted(keys, key=lambda k: (cases.index(k[0]),
                                       METRICS.index(k[1]) if k[1] in METRICS else 50 + keys.index(k)))  # fmt: skip


def table(rows: list[dict], figure: str) -> list[str]:
    """The markdown table of one figure."""
    shown = [c for c in CONTENDERS if any(r["figure"] == figure and r["contender"] == c
                                          for r in rows)]  # fmt: skip
    if not shown:
        return []
    ratio = "boxwood" in shown and "pure JAX" in shown
    lines = ["", f"## {figure}", "",
             "| case | metric | " + " | ".join(shown) + (" | ratio" if ratio else "") + " | notes |",
             "|---" * (len(shown) + 3 + ratio) + "|"]  # fmt: skip
    for case, metric in _keys(rows, figure):
        cell = {r["contender"]: r for r in rows
                if (r["figure"], r["case"], r["metric"]) == (figure, case, metric)}  # fmt: skip
        values = [
            _format(cell[c]["value"], cell[c]["unit"]) if c in cell else ""
            for c in shown
        ]
        text = ""
        ours, peer = cell.get("boxwood"), cell.get("pure JAX")
        if ours and peer and ours["value"] and peer["value"]:
            text = f"{ours['value'] / peer['value']:.2f}"
        notes = "; ".join(f"{c}: {cell[c]['note']}" for c in shown
                          if c in cell and cell[c].get("note"))  # fmt: skip
        lines.append(f"| {case} | {metric} | " + " | ".join(values)
                     + (f" | {text}" if ratio else "") + f" | {notes} |")  # fmt: skip
    return lines


def markdown(rows: list[dict], meta: dict) -> str:
    lines = _header(meta)
    for figure in FIGURES:
        lines += table(rows, figure)
    return "\n".join(lines)
