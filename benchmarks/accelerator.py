"""boxwood on whatever accelerator JAX has (a TPU, a GPU, or the CPU), each figure
beside the same model written by hand in pure JAX, and GPT-2 also in Flax NNX and
Equinox, all calling the same attention kernel.

    python benchmarks/accelerator.py                  # full sizes (minutes on a TPU)
    python benchmarks/accelerator.py --quick          # tiny configs: checks the script
    python benchmarks/accelerator.py --attention splash --remat full --out DIR
    python benchmarks/accelerator.py --only memory    # memory of a step, abstract compile

Figures, in order of priority: the device's bf16 matmul peak and memory
bandwidth; training steps of GPT-2-small (16 x 1024) and a Llama-style 852M model
(4 x 2048): step time, tokens/s, MFU against the measured peak, the first step
(compile included), and GPT-2's boxwood step with its blocks unrolled
(`with_unroll(True)`: no scan; group `unrolled`) in a column of its own; greedy
generation (GPT-2-small, 128 tokens after 32, batch 1 and 32) beside the
bandwidth ceiling; the first step in a fresh process from JAX's
persistent compilation cache; `compiled.memory_analysis()` of a step per remat
policy. Every contender runs in its own fresh process (`_acc_child.py`), one at a
time, each with its own time limit, so that a hang loses only its own figures.
Writes `accelerator.json` (every row, with samples) and `accelerator.md` into
`--out` (default `benchmarks/results/`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _acc_report import finish, markdown  # noqa: E402

CHILD = str(HERE / "_acc_child.py")
GROUPS = (
    "device", "gpt2", "whole", "dropout", "remat", "unrolled", "llama", "generate",
    "ecosystem", "cache", "memory",
)  # fmt: skip
POLICIES = ("none", "dots_with_no_batch_dims_saveable", "full")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny configs, few repetitions")
    p.add_argument("--out", type=Path, default=HERE / "results",
                   help="folder for accelerator.json and accelerator.md")  # fmt: skip
    p.add_argument("--attention", choices=("auto", "xla", "splash"), default="auto",
                   help="the attention kernel of every contender: XLA's "
                   "jax.nn.dot_product_attention, or Pallas splash attention (512 blocks); "
                   "auto: splash on a TPU where boxwood has it, else xla")  # fmt: skip
    p.add_argument("--remat", default="dots_with_no_batch_dims_saveable",
                   help="remat policy of the training steps: none, full or a "
                   "jax.checkpoint_policies name")  # fmt: skip
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="remat policies of the memory figure (comma-separated)",
    )
    p.add_argument("--batch", type=int, default=None, help="GPT-2's batch (16)")
    p.add_argument(
        "--seq", type=int, default=None, help="GPT-2's sequence length (1024)"
    )
    p.add_argument(
        "--llama-batch", type=int, default=None, help="the Llama's batch (4)"
    )
    p.add_argument(
        "--llama-seq", type=int, default=None, help="the Llama's sequence (2048)"
    )
    p.add_argument(
        "--only",
        default=",".join(GROUPS),
        help=f"comma-separated groups, of {', '.join(GROUPS)}",
    )
    p.add_argument(
        "--memory-libs",
        default="boxwood",
        help="contenders of the memory figure: boxwood,jax",
    )
    p.add_argument(
        "--reps", type=int, default=None, help="timed repetitions (5; quick 3)"
    )
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run; processes that would start past it "
                   "are skipped (reported as such)")  # fmt: skip
    p.add_argument(
        "--process-timeout",
        type=float,
        default=None,
        help="seconds one process may take (240; quick 300)",
    )
    p.add_argument("--label", default="", help="a note printed in the header")
    args = p.parse_args(argv)
    unknown = set(args.only.split(",")) - set(GROUPS)
    if unknown:
        p.error(
            f"--only: unknown group(s) {sorted(unknown)}; groups: {', '.join(GROUPS)}"
        )
    return args


def _plan(args: argparse.Namespace) -> list[tuple[str, str, list[dict], dict]]:
    """The processes, in order of priority: (group, name, tasks, spec additions)."""

    def train(lib: str, case: str, task: str = "train", **more: str) -> dict:
        return {"task": task, "lib": lib, "case": case, **more}

    nan = {"env": {"BOXWOOD_ON_ERROR": "nan"}}
    memory_libs = args.memory_libs.split(",")
    plan = [
        ("device", "device: bf16 matmul peak, memory bandwidth",
         [{"task": "env"}, {"task": "device"}], {}),
        ("gpt2", "boxwood, GPT-2 training", [train("boxwood", "gpt2")], {}),
        ("gpt2", "pure JAX, GPT-2 training", [train("jax", "gpt2")], {}),
        ("whole", "boxwood, GPT-2 training, the whole-logits loss",
         [train("boxwood_whole", "gpt2")], {}),
        ("dropout", "boxwood, GPT-2 training, dropout 0.1, rbg masks",
         [train("boxwood_dropout_rbg", "gpt2")], {}),
        ("dropout", "boxwood, GPT-2 training, dropout 0.1, threefry masks",
         [train("boxwood_dropout_threefry", "gpt2")], {}),
        ("remat", "boxwood, GPT-2, choose_remat",
         [{"task": "remat", "lib": "boxwood", "case": "gpt2"}], {}),
        ("unrolled", "boxwood, GPT-2 training, blocks unrolled (with_unroll(True))",
         [train("boxwood_unrolled", "gpt2")], {}),
        ("llama", "boxwood, Llama training", [train("boxwood", "llama")], {}),
        ("llama", "pure JAX, Llama training", [train("jax", "llama")], {}),
        ("generate", "boxwood, generation", [{"task": "generate", "lib": "boxwood"}], {}),
        ("generate", "pure JAX, generation", [{"task": "generate", "lib": "jax"}], {}),
        ("ecosystem", "Flax NNX, GPT-2 training", [train("nnx", "gpt2")], {}),
        ("ecosystem", "Equinox, GPT-2 training", [train("eqx", "gpt2")], {}),
        ("cache", "boxwood, first step, BOXWOOD_ON_ERROR=nan (fills the cache)",
         [train("boxwood", "gpt2", "first")], nan),
        ("cache", "boxwood, first step from the persistent cache",
         [train("boxwood", "gpt2", "first", mode="cache")], nan),
        ("cache", "pure JAX, first step (fills the cache)",
         [train("jax", "gpt2", "first")], {}),
        ("cache", "pure JAX, first step from the persistent cache",
         [train("jax", "gpt2", "first", mode="cache")], {}),
    ]  # fmt: skip
    for lib in memory_libs:
        tasks = [{"task": "memory", "lib": lib, "case": c} for c in ("gpt2", "llama")]
        plan.append(("memory", f"{lib}, memory of a step", tasks, {}))
    wanted = set(args.only.split(","))
    return [p for p in plan if p[0] in wanted]


def _child(spec: dict, timeout: float) -> tuple[list[dict], dict, str]:
    """Run one process; returns its rows, its INFO dict and its error text."""
    env = dict(os.environ, **spec.get("env", {}))
    try:
        done = subprocess.run([sys.executable, CHILD, json.dumps(spec)], env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        out, err, failed = done.stdout, done.stderr, done.returncode != 0
    except subprocess.TimeoutExpired as stopped:
        out = _text(stopped.stdout)
        err = _text(stopped.stderr) + f"\nstopped at its time limit ({timeout:.0f} s)"
        failed = True
    rows = [json.loads(x[4:]) for x in out.splitlines() if x.startswith("ROW ")]
    infos = [json.loads(x[5:]) for x in out.splitlines() if x.startswith("INFO ")]
    if err.strip():
        print(err.strip()[-3000:], file=sys.stderr, flush=True)
    return rows, (infos[0] if infos else {}), (err.strip()[-2000:] if failed else "")


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _skipped(tasks: list[dict], why: str) -> list[dict]:
    return [{"figure": t["task"], "case": t.get("case", ""), "contender": t.get("lib", ""),
             "metric": "skipped", "value": None, "unit": "", "note": why, "task": t}
            for t in tasks if t["task"] != "env"]  # fmt: skip


def _attention(args: argparse.Namespace, info: dict) -> str:
    if args.attention != "auto":
        return args.attention
    return (
        "splash"
        if info.get("backend") == "tpu" and info.get("boxwood_splash")
        else "xla"
    )


def _run_plan(args: argparse.Namespace, base: dict, deadline: float) -> tuple:
    rows: list[dict] = []
    info: dict = {}
    errors: dict[str, str] = {}
    limit = args.process_timeout or (300.0 if args.quick else 240.0)
    plan = _plan(args)
    if plan and plan[0][0] != "device":
        plan.insert(0, ("env", "environment", [{"task": "env"}], {}))
    with tempfile.TemporaryDirectory() as cache:
        for _group, name, tasks, more in plan:
            left = deadline - time.monotonic()
            if left < 10:
                rows += _skipped(tasks, f"skipped: time budget spent before '{name}'")
                continue
            base["attention"] = _attention(args, info)
            spec = dict(base, tasks=tasks, cache=cache, **more)
            print(
                f"[accelerator.py] {name} ({left:.0f} s left)",
                file=sys.stderr,
                flush=True,
            )
            got, got_info, error = _child(spec, min(left, limit))
            rows += got
            info = info or got_info
            bandwidth = [
                r["value"] for r in got if r.get("unit") == "GB/s" and r["value"]
            ]
            if bandwidth:
                base["bandwidth"] = max(bandwidth) * 1e9
            if error:
                errors[name] = error
                print(
                    f"[accelerator.py] {name}: {error[-600:]}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows, info, errors


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                              capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=HERE, capture_output=True, text=True, timeout=10).stdout  # fmt: skip
        return (head or "unknown") + (
            " (with uncommitted changes)" if dirty.strip() else ""
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    started, load = time.monotonic(), os.getloadavg()
    deadline = started + (args.budget if args.budget else 24 * 3600.0)
    reps = args.reps or (3 if args.quick else 5)
    sizes = {
        "gpt2": [args.batch, args.seq],
        "llama": [args.llama_batch, args.llama_seq],
    }
    defaults = {"gpt2": (4, 128) if args.quick else (16, 1024),
                "llama": (2, 128) if args.quick else (4, 2048)}  # fmt: skip
    sizes = {
        k: [v[0] or defaults[k][0], v[1] or defaults[k][1]] for k, v in sizes.items()
    }
    base = dict(quick=args.quick, reps=reps, target_s=0.2 if args.quick else 1.0,
                remat=args.remat, policies=args.policies.split(","), sizes=sizes)  # fmt: skip
    rows, info, errors = _run_plan(args, base, deadline)
    now = datetime.datetime.now(datetime.timezone.utc)
    meta = dict(info, date=now.isoformat(timespec="seconds"), quick=args.quick, reps=reps,
                commit=_commit(), label=args.label, load_average_start=load,
                cores=os.cpu_count(), wall_s=round(time.monotonic() - started, 1),
                errors=errors, attention=base.get("attention", args.attention),
                remat=args.remat, sizes=sizes)  # fmt: skip
    rows = finish(rows, meta)
    text = markdown(rows, meta)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "accelerator.json"
    out.write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n"
    )
    out.with_suffix(".md").write_text(text + "\n")
    print(f"\nwrote {out} and {out.with_suffix('.md').name}", file=sys.stderr)
    return 1 if errors or any(r["metric"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
