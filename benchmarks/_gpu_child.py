"""One fresh process of `benchmarks/gpu.py`: runs the tasks of a JSON spec and
prints one `ROW {json}` line per result row (flushed as each task ends, so a
process stopped at its time limit still gives what it finished).

    python benchmarks/_gpu_child.py '{"tasks": [...], "quick": true, ...}'

Spec keys: `tasks` (each a dict with `task`: `env`, `peak`, `train`, `generate`
or `load`, and `lib`: `boxwood`, `eager` or `compile`), `quick`, `reps`,
`target_s` (seconds per timed repetition), `cache` (a persistent compilation
cache folder, or null), `checkpoint` (the GPT-2 directory).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gpu_cases as cases  # noqa: E402
from _timing import row  # noqa: E402


def _emit(rows: list[dict], load: tuple) -> None:
    for r in rows:
        r["load_average"] = [round(x, 2) for x in load]
        print("ROW " + json.dumps(r, default=str), flush=True)


def env_info(with_torch: bool) -> dict:
    import importlib.metadata as md

    import jax

    info = {
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }
    info["device_kind"] = jax.devices()[0].device_kind
    info.update(jax=jax.__version__, jaxlib=md.version("jaxlib"))
    plugins = {d.metadata["Name"]: d.version for d in md.distributions()
               if d.metadata["Name"] and d.metadata["Name"].startswith("jax-cuda")}  # fmt: skip
    info["jax_cuda_plugins"] = plugins
    try:
        info["platform_version"] = jax.devices()[0].client.platform_version
    except Exception:  # noqa: BLE001 - not every backend says
        info["platform_version"] = None
    info["xla_threads"] = len(os.sched_getaffinity(0))
    if with_torch:
        import transformers

        import _gpu_torch

        info.update(_gpu_torch.setup(), transformers=transformers.__version__)
    return info


def _peak(spec: dict) -> list[dict]:
    import jax

    import _gpu_jax
    import _gpu_torch

    size = cases.peak_size(jax.default_backend(), spec["quick"])
    reps = max(spec["reps"], 3)
    jx = _gpu_jax.matmul_peak(size, reps)
    th = _gpu_torch.matmul_peak(size, reps)
    fig = f"bf16 matmul peak ({size} x {size} x {size})"
    return [row(fig, "device peak", "jax", "TFLOP/s", jx["tflops"], "TFLOP/s"),
            row(fig, "device peak", "torch", "TFLOP/s", th["tflops"], "TFLOP/s")]  # fmt: skip


def _train(spec: dict, task: dict) -> list[dict]:
    case = cases.train_cases(spec["quick"])[task["case"]]
    if task["lib"] == "boxwood":
        import _gpu_jax

        return _gpu_jax.train(case, spec["reps"], spec["target_s"], task["cold"])
    import _gpu_torch

    return _gpu_torch.train(
        case, task["lib"] == "compile", spec["reps"], spec["target_s"]
    )


def _generate(spec: dict, task: dict) -> list[dict]:
    case = cases.generate_case(spec["quick"])
    if task["lib"] == "boxwood":
        import _gpu_jax

        return _gpu_jax.generate(case, spec["checkpoint"], spec["reps"], task["cold"])
    import _gpu_torch

    return _gpu_torch.generate(case, spec["checkpoint"], spec["reps"])


def _load(spec: dict) -> list[dict]:
    import jax
    import transformers

    import _gpu_torch
    import boxwood.models as bm
    from _timing import interleave_once, median

    directory = spec["checkpoint"]
    hf: Any = transformers

    def ours() -> dict:
        start = time.perf_counter()
        jax.block_until_ready(bm.from_pretrained(directory))
        return {"t": time.perf_counter() - start}

    def theirs() -> dict:
        start = time.perf_counter()
        model = hf.GPT2LMHeadModel.from_pretrained(directory)
        model.to(_gpu_torch.device())
        _gpu_torch.sync()
        return {"t": time.perf_counter() - start}

    names = {"boxwood": ours, _gpu_torch.EAGER: theirs}
    results = interleave_once(names, reps=max(spec["reps"], 3))
    return [
        row(cases.LOAD, "checkpoint in float32", name, "load onto the device",
            median(r["t"]) * 1e3, "ms", samples=[t * 1e3 for t in r["t"]],
            note="from_pretrained(dir)" if name == "boxwood"
            else "from_pretrained(dir).to(device)")
        for name, r in results.items()
    ]  # fmt: skip


def _checkpoint(spec: dict) -> list[dict]:
    """A GPT-2 checkpoint of random weights, written by boxwood's
    `save_pretrained` (float32) into `spec["checkpoint"]`."""
    import jax

    import boxwood.models as bm

    config = bm.GPT2Config(**cases.gpt2_options(spec["quick"]))
    model = bm.GPT2LMHeadModel(config, key=jax.random.key(0))
    bm.save_pretrained(model, spec["checkpoint"])
    return []


_FIGURES = {"train": cases.TRAIN, "generate": cases.GENERATE, "load": cases.LOAD}


def _run(spec: dict, task: dict) -> list[dict]:
    kind = task["task"]
    if kind == "checkpoint":
        return _checkpoint(spec)
    if kind == "peak":
        return _peak(spec)
    if kind == "train":
        return _train(spec, task)
    if kind == "generate":
        return _generate(spec, task)
    if kind == "load":
        return _load(spec)
    raise ValueError(f"unknown task {kind!r}")


def main(spec: dict) -> None:
    if spec.get("cache"):
        import jax

        jax.config.update("jax_compilation_cache_dir", spec["cache"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    for task in spec["tasks"]:
        load = os.getloadavg()
        if task["task"] == "env":
            info = env_info(task.get("torch", False))
            print("INFO " + json.dumps(info, default=str), flush=True)
            continue
        try:
            rows = _run(spec, task)
        except Exception as error:  # noqa: BLE001 - reported as a failed row
            traceback.print_exc()
            why = f"FAILED: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            figure = _FIGURES.get(task["task"], task["task"])
            who = {
                "eager": "transformers eager",
                "compile": "transformers torch.compile",
            }
            case = task.get("case", "")
            if case:
                case = cases.train_cases(spec["quick"])[case].title
            lib = str(task.get("lib", ""))
            rows = [row(str(figure), str(case), who.get(lib, lib),
                        "error", None, "", note=why, task=task)]  # fmt: skip
        _emit(rows, load)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
