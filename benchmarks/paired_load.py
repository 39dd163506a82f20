"""Paired A/B of `boxwood.models.from_pretrained` between two boxwood source trees:
load time and peak memory.

    python benchmarks/paired_load.py A_SRC B_SRC [--rounds 5] [--quick] [--out FILE]

`A_SRC` and `B_SRC` are `src` folders of two checkouts. The model is
`bench_models.py`'s: GPT-2-small-shaped (124M parameters; a 4-layer, 256-wide one
with `--quick`), random weights written by `transformers`' `save_pretrained`, in
that file, in that file with its data 8 bytes off a 64-byte boundary (nothing
can be mapped, everything is copied), and written again by boxwood (every
tensor aligned, each parameter's layers back to back: mapped). Each load is a
fresh process, imports and the CPU client started first (not timed): the load,
then a read of every byte of every weight (a sum), so that a load that maps
the file pays for reading it; the process reports both times, its peak
resident memory during the load and the read (`VmHWM`, reset just before the
load) and its resident memory before it (Linux only). In each
round every file is loaded by A, then B, then B, then A (the order alternates
between rounds); the table gives the medians and B / A. Load averages before
and after are printed: on a busy machine the figures say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_models import _aligned_copy, _save_checkpoint, _shifted_copy

_CHILD = r"""
import json, os, sys, time
import numpy as np
import jax, boxwood.models as bm
jax.devices()  # the CPU client started, not timed

def status(key):  # in bytes
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(key + ":"))
    return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from here on: the load's
before = status("VmRSS")
start = time.perf_counter()
model = bm.from_pretrained(sys.argv[1])
arrays = [x for x in jax.tree.leaves(model) if isinstance(x, jax.Array)]
jax.block_until_ready(arrays)
loaded = time.perf_counter()
total = sum(float(np.asarray(a).sum(dtype=np.float64)) for a in arrays)
touched = time.perf_counter()
peak = status("VmHWM")
print(json.dumps({
    "load_ms": (loaded - start) * 1e3,
    "touched_ms": (touched - start) * 1e3,
    "peak_mb": peak / 2**20,
    "peak_over_start_mb": (peak - before) / 2**20,
}))
"""


def _child(src: str, directory: str) -> dict:
    path = os.pathsep.join(
        p for p in (os.path.abspath(src), os.environ.get("PYTHONPATH")) if p
    )
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _CHILD, directory],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"child for {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a_src")
    parser.add_argument("b_src")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as root:
        files = {
            "transformers' file": os.path.join(root, "transformers"),
            "file 8 bytes off": os.path.join(root, "shifted"),
            "boxwood's file (aligned)": os.path.join(root, "aligned"),
        }
        _save_checkpoint(files["transformers' file"], args.quick)
        _shifted_copy(files["transformers' file"], files["file 8 bytes off"])
        _aligned_copy(files["transformers' file"], files["boxwood's file (aligned)"])
        samples: dict = {(f, s): [] for f in files for s in "AB"}
        for r in range(args.rounds):
            for name, directory in files.items():
                order = "ABBA" if r % 2 == 0 else "BAAB"
                for side in order:
                    src = args.a_src if side == "A" else args.b_src
                    samples[name, side].append(_child(src, directory))
    after = os.getloadavg()
    rows = []
    for name in files:
        row = {"file": name}
        for metric in ("load_ms", "touched_ms", "peak_mb", "peak_over_start_mb"):
            a = statistics.median(s[metric] for s in samples[name, "A"])
            b = statistics.median(s[metric] for s in samples[name, "B"])
            row[metric] = {"A": round(a, 1), "B": round(b, 1), "B/A": round(b / a, 3)}
        rows.append(row)
    result = {
        "a_src": args.a_src, "b_src": args.b_src, "rounds": args.rounds,
        "processes_per_side_and_file": 2 * args.rounds, "quick": args.quick,
        "load_average_before": before, "load_average_after": after,
        "rows": rows, "samples": {f"{f} / {s}": v for (f, s), v in samples.items()},
    }  # fmt: skip
    for row in rows:
        print(row["file"])
        for metric, cell in row.items():
            if metric != "file":
                print(
                    f"  {metric:20} A {cell['A']:9.1f}  B {cell['B']:9.1f}  B/A {cell['B/A']:.3f}"
                )
    print(f"load average before {before}, after {after}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
