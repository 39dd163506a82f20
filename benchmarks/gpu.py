"""boxwood on whatever device JAX has (a GPU where there is one, the CPU
otherwise), each figure beside `transformers` PyTorch on the same device.

    python benchmarks/gpu.py            # issue #36's sizes (minutes on a GPU)
    python benchmarks/gpu.py --quick    # tiny configs: checks the script (~2 min on 2 cores)
    python benchmarks/gpu.py --budget 300 --out $OUT/gpu.json

Figures: training steps of GPT-2-small and a Llama-style 852M model (tokens/s,
MFU against the device's measured bf16 matmul peak, the step's compile time cold
and from JAX's persistent compilation cache); greedy generation at batch 1 and 32
(tokens/s, time to the first token with and without the cache); `from_pretrained`
onto the device. Every measurement runs in a fresh process (`_gpu_child.py`), one
process at a time, so that JAX's and PyTorch's allocators never share the device
and cold figures are cold. It prints a markdown table and writes the rows as JSON
(default `benchmarks/results/gpu-DATE-BACKEND.json`) with a `.md` beside it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _gpu_report import finish, markdown  # noqa: E402

CHILD = str(HERE / "_gpu_child.py")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny configs, few repetitions"
    )
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run; processes that would start "
                        "past it are skipped (reported as such)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write")
    parser.add_argument(
        "--reps", type=int, default=None, help="timed repetitions (5; quick 3)"
    )
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=None,
                        help="measure torch.compile (default: yes, except with --quick on "
                        "a CPU-only machine, where inductor's C++ build takes minutes)")  # fmt: skip
    parser.add_argument("--label", default="", help="a note printed in the header")
    return parser.parse_args(argv)


def _plan(
    quick: bool, torch_ok: bool, compile_ok: bool
) -> list[tuple[str, list[dict], bool]]:
    """The processes, in order of priority: (name, tasks, uses the cache folder)."""
    env = [{"task": "env", "torch": torch_ok}, {"task": "checkpoint"}]
    models = ("gpt2", "llama")

    def tasks(lib: str, cold: bool = True, generate: bool = True) -> list[dict]:
        # Generation first: its first call is then the process's first computation.
        out = [{"task": "generate", "lib": lib, "cold": cold}] if generate else []
        return out + [
            {"task": "train", "lib": lib, "case": c, "cold": cold} for c in models
        ]

    plan = [("setup", env + ([{"task": "peak"}] if torch_ok else []), False),
            ("boxwood, cold (fills the cache)", tasks("boxwood"), True)]  # fmt: skip
    if torch_ok:
        plan.append(("transformers eager", tasks("eager"), False))
    plan.append(("boxwood, persistent cache", tasks("boxwood", cold=False), True))
    if torch_ok:
        plan.append(("from_pretrained", [{"task": "load"}], False))
    if torch_ok and compile_ok:
        plan.append(
            ("transformers torch.compile", tasks("compile", generate=False), False)
        )
    return plan


def _child(spec: dict, timeout: float) -> tuple[list[dict], dict, str]:
    """Run one process; returns its rows, its INFO dict and its error text."""
    try:
        done = subprocess.run([sys.executable, CHILD, json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        out, err, failed = done.stdout, done.stderr, done.returncode != 0
    except subprocess.TimeoutExpired as stopped:
        out = _text(stopped.stdout)
        err = _text(stopped.stderr) + f"\nstopped at its time limit ({timeout:.0f} s)"
        failed = True
    rows = [json.loads(x[4:]) for x in out.splitlines() if x.startswith("ROW ")]
    infos = [json.loads(x[5:]) for x in out.splitlines() if x.startswith("INFO ")]
    return rows, (infos[0] if infos else {}), (err.strip()[-2000:] if failed else "")


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _skipped(tasks: list[dict], why: str) -> list[dict]:
    return [{"figure": t["task"], "case": t.get("case", ""), "contender": t.get("lib", ""),
             "metric": "skipped", "value": None, "unit": "", "note": why, "task": t}
            for t in tasks if t["task"] not in ("env", "checkpoint")]  # fmt: skip


def _run_plan(
    args: argparse.Namespace, plan: list, base: dict, deadline: float
) -> tuple:
    rows: list[dict] = []
    info: dict = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, tasks, cached in plan:
            left = deadline - time.monotonic()
            if left < (10 if args.quick else 30):
                rows += _skipped(tasks, f"skipped: time budget spent before '{name}'")
                continue
            spec = dict(base, tasks=tasks, cache=cache if cached else None)
            budget = f"{left:.0f} s of the budget left" if args.budget else "no budget"
            print(f"[gpu.py] {name} ({budget})", file=sys.stderr, flush=True)
            got, got_info, error = _child(spec, left)
            rows += got
            info = info or got_info
            if error:
                errors[name] = error
                print(f"[gpu.py] {name}: {error[-600:]}", file=sys.stderr, flush=True)
    return rows, info, errors


def _environment() -> tuple[bool, bool, str]:
    torch_ok = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
    why = "" if torch_ok else "torch or transformers is not installed"
    return torch_ok, torch_ok, why


def _torch_compile(args: argparse.Namespace, available: bool) -> tuple[bool, str]:
    if not available:
        return False, "skipped: torch is not installed"
    if args.torch_compile is not None:
        return (
            args.torch_compile,
            "" if args.torch_compile else "skipped (--no-torch-compile)",
        )
    if args.quick and shutil.which("nvidia-smi") is None:
        return False, "skipped with --quick on a CPU (--torch-compile to run it)"
    return True, ""


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                              capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=HERE, capture_output=True, text=True, timeout=10).stdout  # fmt: skip
        return head + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    started, load = time.monotonic(), os.getloadavg()
    deadline = started + (args.budget if args.budget else 24 * 3600.0)
    torch_ok, compile_ok, why = _environment()
    compile_ok, compile_why = _torch_compile(args, compile_ok)
    reps = args.reps or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory() as checkpoint:
        base = dict(quick=args.quick, reps=reps, target_s=0.3 if args.quick else 1.0,
                    checkpoint=checkpoint)  # fmt: skip
        plan = _plan(args.quick, torch_ok, compile_ok)
        rows, info, errors = _run_plan(args, plan, base, deadline)
    meta = dict(info, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                quick=args.quick, reps=reps, commit=_commit(), label=args.label,
                load_average_start=load, cores=os.cpu_count(),
                wall_s=round(time.monotonic() - started, 1), errors=errors,
                torch_missing=why, torch_compile=compile_why)  # fmt: skip
    rows = finish(rows, meta)
    text = markdown(rows, meta)
    print(text)
    out = args.out or HERE / "results" / _file_name(meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n"
    )
    out.with_suffix(".md").write_text(text + "\n")
    print(f"\nwrote {out} and {out.with_suffix('.md').name}", file=sys.stderr)
    return 1 if errors else 0


def _file_name(meta: dict) -> str:
    day = meta["date"][:10]
    return f"gpu-{day}-{meta.get('backend', 'unknown')}{'-quick' if meta['quick'] else ''}.json"


if __name__ == "__main__":
    sys.exit(main())
