"""One fresh process of `benchmarks/accelerator.py`: runs the tasks of a JSON spec
and prints one `ROW {json}` line per result row (flushed as each task ends, so a
process stopped at its time limit still gives what it finished).

    python benchmarks/_acc_child.py '{"tasks": [...], "quick": true, ...}'

Spec keys: `tasks` (each a dict with `task`: `env`, `device`, `train`, `first`,
`generate` or `memory`; `lib`: `boxwood`, `boxwood_unrolled` (training only:
the blocks unrolled, `with_unroll(True)`), `jax`, `nnx` or `eqx`; `case`: `gpt2`
or `llama`), `quick`, `reps`, `target_s` (seconds per timed repetition),
`attention` (`xla` or `splash`), `remat` (`none`, `full` or a
`jax.checkpoint_policies` name), `policies` (the remat policies of the memory
figure), `sizes` (`{"gpt2": [batch, seq], ...}`), `cache` (a persistent
compilation cache folder, or null).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _acc_cases as cases  # noqa: E402
from _timing import row  # noqa: E402


def _emit(rows: list[dict], load: tuple) -> None:
    for r in rows:
        r["load_average"] = [round(x, 2) for x in load]
        print("ROW " + json.dumps(r, default=str), flush=True)


def env_info() -> dict:
    import importlib.metadata as md

    import jax

    info: dict[str, Any] = {"backend": jax.default_backend(),
                            "devices": [str(d) for d in jax.devices()],
                            "device_kind": jax.devices()[0].device_kind}  # fmt: skip
    for name in ("jax", "jaxlib", "libtpu", "flax", "equinox", "optax"):
        try:
            info[name] = md.version(name)
        except md.PackageNotFoundError:
            info[name] = None
    try:
        info["platform_version"] = jax.devices()[0].client.platform_version
    except Exception:  # noqa: BLE001 - not every backend says
        info["platform_version"] = None
    info["cpu_threads"] = len(os.sched_getaffinity(0))
    import _acc_boxwood

    info["boxwood_splash"] = _acc_boxwood.has_splash()
    return info


def _device(spec: dict) -> list[dict]:
    """The bf16 matmul peak and the memory bandwidth (copy and reduction)."""
    import jax
    import jax.numpy as jnp

    from _acc_timing import repeat

    backend, reps = jax.default_backend(), max(spec["reps"], 3)
    size = cases.peak_size(backend, spec["quick"])
    keys = jax.random.split(jax.random.key(0), 2)
    a, b = (jax.random.normal(k, (size, size), jnp.bfloat16) for k in keys)
    chain = jax.jit(lambda a, b: [a @ (b + i) for i in range(10)])
    jax.block_until_ready(chain(a, b))
    seconds = repeat(lambda a=a, b=b: jax.block_until_ready(chain(a, b)), reps) / 10
    rows = [row(cases.DEVICE, "bf16 matmul peak", "bound", "TFLOP/s", 2 * size**3 / seconds / 1e12,
                "TFLOP/s", note=f"{size}-square products, 10 chained per call")]  # fmt: skip
    n = cases.bandwidth_bytes(backend, spec["quick"])
    x = jnp.zeros((n // 2,), jnp.bfloat16)
    del a, b
    for what, fn, traffic in (("copy (x + 1)", jax.jit(lambda x: x + 1), 2 * n),
                              ("reduction (sum)", jax.jit(lambda x: x.sum(dtype=jnp.float32)), n)):  # fmt: skip
        jax.block_until_ready(fn(x))

        def calls(fn: Any = fn) -> None:
            out = None
            for _ in range(10):
                out = fn(x)
            jax.block_until_ready(out)

        seconds = repeat(calls, reps) / 10
        rows.append(row(cases.DEVICE, f"memory bandwidth, {what}", "bound", "GB/s",
                        traffic / seconds / 1e9, "GB/s",
                        note=f"{n >> 20} MiB bf16 array, {traffic >> 20} MiB moved per call"))  # fmt: skip
    return rows


def _ids(case: cases.TrainCase) -> Any:
    import jax

    vocab = case.options["vocab_size"]
    return jax.random.randint(jax.random.key(1), (case.batch, case.seq), 0, vocab)


def _trainer(spec: dict, lib: str, case: cases.TrainCase) -> tuple:
    """`(run, info)`: `run(n)` takes `n` steps and returns the last loss."""
    import jax
    import jax.numpy as jnp

    kind, remat, ids = spec["attention"], spec["remat"], _ids(case)
    if lib in cases.BOXWOOD_UNROLL:
        import _acc_boxwood

        unroll = cases.BOXWOOD_UNROLL[lib]
        loss = cases.BOXWOOD_LOSS.get(lib, "chunked")
        dropout = cases.BOXWOOD_DROPOUT.get(lib)
        return _acc_boxwood.trainer(case, kind, remat, ids, unroll, loss, dropout)
    if lib == "jax":
        import optax

        import _acc_jax
        from _acc_boxwood import OPTIMISER

        params = _acc_jax.INITS[case.name](
            case.options, jax.random.key(0), jnp.bfloat16
        )
        optimiser = optax.adamw(**OPTIMISER)
        carry = [params, optimiser.init(params), None]
        step = _acc_jax.train_step(case.name, case.options, kind, remat, optimiser)

        def run(n: int) -> Any:
            for _ in range(n):
                carry[0], carry[1], carry[2] = step(ids, carry[0], carry[1])
            return jax.block_until_ready(carry[2])

        return run, {}
    if case.name != "gpt2":
        raise ValueError(f"{lib} has GPT-2 only")
    module = __import__(f"_acc_{lib}")
    model = module.build(case.options, kind, remat, jnp.bfloat16)
    if lib == "nnx":
        nnx_step, optimiser = module.trainer(model)

        def run_nnx(n: int) -> Any:
            loss = None
            for _ in range(n):
                loss = nnx_step(model, optimiser, ids)
            return jax.block_until_ready(loss)

        return run_nnx, {}
    eqx_step, state = module.trainer(model)
    carry = [model, state, None]

    def run_eqx(n: int) -> Any:
        for _ in range(n):
            carry[0], carry[1], carry[2] = eqx_step(ids, carry[0], carry[1])
        return jax.block_until_ready(carry[2])

    return run_eqx, {}


def _train(spec: dict, task: dict) -> list[dict]:
    from _acc_timing import Compiles, steady_time

    case = cases.train_cases(spec["quick"], spec.get("sizes"))[task["case"]]
    who = cases.LIBS[task["lib"]]
    run, info = _trainer(spec, task["lib"], case)
    with Compiles() as compiles:
        start = time.perf_counter()
        run(1)
        first = time.perf_counter() - start
    cached = task.get("mode") == "cache"
    label = "persistent cache" if cached else "cold"
    if spec.get("env", {}).get("BOXWOOD_ON_ERROR"):
        label += f", BOXWOOD_ON_ERROR={spec['env']['BOXWOOD_ON_ERROR']}"
    rows = [row(cases.TRAIN, case.label, who, f"first step, {label}", first, "s",
                note=compiles.note(), **compiles.fields())]  # fmt: skip
    if task["task"] == "first":
        return rows
    per_step, samples = steady_time(run, spec["reps"], spec["target_s"])
    loss = float(run(1))
    extra = dict(
        params=case.params, flops_per_token=case.flops_per_token, final_loss=loss
    )
    rows += [
        row(cases.TRAIN, case.label, who, "step time", per_step * 1e3, "ms",
            samples=[s * 1e3 for s in samples], **extra),
        row(cases.TRAIN, case.label, who, "tokens/s", case.tokens / per_step, "tok/s",
            samples=[case.tokens / s for s in samples], note=f"loss after the run {loss:.3f}",
            **extra),
    ]  # fmt: skip
    if "lowered_text" in info:
        callbacks = sorted(
            set(re.findall(r"custom_call @(\w*callback\w*)", info["lowered_text"]()))
        )
        rows[0]["host_callbacks"] = callbacks
        if callbacks:
            rows[0]["note"] += f"; host callbacks in the step: {', '.join(callbacks)}"
    return rows


def _generate(spec: dict, task: dict) -> list[dict]:
    import jax.numpy as jnp
    import numpy as np

    import _acc_boxwood
    from _acc_timing import Compiles, timed

    case = cases.generate_case(spec["quick"])
    model = _acc_boxwood.generation_model(case.options)
    if task["lib"] == "boxwood":

        def fn(prompt: Any) -> Any:
            return _acc_boxwood.generate(model, prompt, case.new_tokens)
    else:
        import _acc_jax

        params = _acc_jax.from_boxwood_gpt2(model)
        del model

        def fn(prompt: Any) -> Any:
            return _acc_jax.gpt2_generate(params, prompt, case.new_tokens, case.options)

    who = cases.LIBS[task["lib"]]
    rows: list[dict] = []
    vocab = case.options["vocab_size"]
    for batch in case.batches:
        prompt = np.random.RandomState(0).randint(0, vocab, (batch, case.prompt))
        ids = jnp.asarray(prompt.astype(np.int32))
        with Compiles() as compiles:
            first = timed(lambda ids=ids: np.asarray(fn(ids)))
        times = [
            timed(lambda ids=ids: np.asarray(fn(ids))) for _ in range(spec["reps"])
        ]
        out = np.asarray(fn(ids))
        n = batch * case.new_tokens
        per = float(np.median(times))
        title = case.label(batch)
        rows += [
            row(cases.GENERATE, title, who, "tokens/s", n / per, "tok/s",
                samples=[n / t for t in times], tokens=out[0, case.prompt:].tolist()),
            row(cases.GENERATE, title, who, "first call (compile included)", first, "s",
                note=compiles.note()),
        ]  # fmt: skip
        ceiling = batch * spec.get("bandwidth", 0) / case.param_bytes
        if task["lib"] == "jax" and ceiling:
            rows.append(row(cases.GENERATE, title, "bound", "tokens/s", ceiling, "tok/s",
                            note=f"bandwidth ceiling: {batch} x measured bandwidth / "
                            f"{case.param_bytes / 1e6:.3g} MB of parameters"))  # fmt: skip
    return rows


def _memory(spec: dict, task: dict) -> list[dict]:
    """`compiled.memory_analysis()` of the training step, compiled from abstract
    arrays, for every remat policy."""
    import jax
    import jax.numpy as jnp
    import optax

    import _acc_boxwood
    import _acc_jax

    case = cases.train_cases(spec["quick"], spec.get("sizes"))[task["case"]]
    rows = []
    for policy in spec["policies"]:
        if task["lib"] == "boxwood":
            jitted, args = _acc_boxwood.abstract_step(case, spec["attention"], policy)
        else:
            optimiser = optax.adamw(**_acc_boxwood.OPTIMISER)
            params = jax.eval_shape(lambda: _acc_jax.INITS[case.name](
                case.options, jax.random.key(0), jnp.bfloat16))  # fmt: skip
            state = jax.eval_shape(optimiser.init, params)
            ids = jax.ShapeDtypeStruct((case.batch, case.seq), jnp.int32)
            jitted = _acc_jax.train_step(case.name, case.options, spec["attention"], policy,
                                         optimiser)  # fmt: skip
            args = (ids, params, state)
        try:
            stats = jitted.lower(*args).compile().memory_analysis()
        except Exception as error:  # noqa: BLE001 - a step too large for the device
            text = str(error).strip().splitlines()[0][:300]
            rows.append(row(cases.MEMORY, case.label, cases.LIBS[task["lib"]],
                            f"peak, remat {policy}", None, "GiB",
                            note=f"FAILED: {type(error).__name__}: {text}"))  # fmt: skip
            continue
        parts = {k: int(getattr(stats, f"{k}_size_in_bytes", 0) or 0)
                 for k in ("temp", "argument", "output", "alias")}  # fmt: skip
        peak = parts["temp"] + parts["argument"] + parts["output"] - parts["alias"]
        gib = 1 << 30
        note = ", ".join(f"{k} {v / gib:.3g}" for k, v in parts.items()) + " GiB"
        rows.append(row(cases.MEMORY, case.label, cases.LIBS[task["lib"]],
                        f"peak, remat {policy}", peak / gib, "GiB", note=note,
                        bytes=parts, params=case.params))  # fmt: skip
    return rows


def _remat(spec: dict, task: dict) -> list[dict]:
    """`boxwood.models.choose_remat` of boxwood's training step: each policy's
    memory and step time, and the policy chosen."""
    import _acc_boxwood

    case = cases.train_cases(spec["quick"], spec.get("sizes"))[task["case"]]
    choice = _acc_boxwood.remat_choice(case, spec["attention"], _ids(case))
    print(str(choice), file=sys.stderr, flush=True)
    rows = []
    for r in choice.rows:
        chosen = " (chosen)" if r.policy == choice.policy else ""
        note = f"{'fits' if r.fits else 'does not fit'}{chosen}"
        if r.peak_bytes is not None:
            note += f", {r.peak_bytes / (1 << 30):.2f} GiB"
        if r.error:
            note += f"; {r.error}"
        value = None if r.step_seconds is None else case.tokens / r.step_seconds
        rows.append(row(cases.TRAIN, case.label, "boxwood",
                        f"tokens/s, choose_remat: {r.policy}", value, "tok/s",
                        note=note, peak_bytes=r.peak_bytes,
                        compile_s=r.compile_seconds, chosen=bool(chosen),
                        reason=choice.reason))  # fmt: skip
    return rows


def _run(spec: dict, task: dict) -> list[dict]:
    kind = task["task"]
    if kind == "remat":
        return _remat(spec, task)
    if kind == "device":
        return _device(spec)
    if kind in ("train", "first"):
        return _train(spec, task)
    if kind == "generate":
        return _generate(spec, task)
    if kind == "memory":
        return _memory(spec, task)
    raise ValueError(f"unknown task {kind!r}")


_FIGURES = {"train": cases.TRAIN, "first": cases.TRAIN, "remat": cases.TRAIN, "generate": cases.GENERATE,
            "memory": cases.MEMORY, "device": cases.DEVICE}  # fmt: skip


def main(spec: dict) -> None:
    if spec.get("cache"):
        import jax

        jax.config.update("jax_compilation_cache_dir", spec["cache"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    for task in spec["tasks"]:
        load = os.getloadavg()
        if task["task"] == "env":
            print("INFO " + json.dumps(env_info(), default=str), flush=True)
            continue
        try:
            rows = _run(spec, task)
        except Exception as error:  # noqa: BLE001 - reported as a failed row
            traceback.print_exc()
            text = (
                str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            )
            why = f"FAILED: {type(error).__name__}: {text}"
            case = task.get("case", "")
            if case:
                case = cases.train_cases(spec["quick"], spec.get("sizes"))[case].label
            rows = [row(_FIGURES.get(task["task"], task["task"]), str(case),
                        cases.LIBS.get(task.get("lib", ""), "bound"), "error", None, "",
                        note=why, task=task)]  # fmt: skip
        _emit(rows, load)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
