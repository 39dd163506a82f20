"""The first step's host side on the CPU: trace, lowering and (optionally) XLA
compile of GPT-2's training step, boxwood's (`causal_lm_loss`, the model as
`accelerator.py` builds it) against the hand-written pure-JAX step of
`_acc_jax.py`, each in a fresh process, the two alternating round after round:

    python benchmarks/bench_trace_lower.py                 # GPT-2-small, 16 x 1024
    python benchmarks/bench_trace_lower.py --rounds 5 --compile
    python benchmarks/bench_trace_lower.py --quick         # tiny sizes
    python benchmarks/bench_trace_lower.py --platform tpu --unroll  # a TPU's, here

Arguments are abstract (`jax.ShapeDtypeStruct`): nothing is allocated. Each
process first lowers and compiles a tiny unrelated function (JAX's own first
use), then times `step.lower(...)`: wall and this process's CPU time (less
sensitive to a loaded machine), with JAX's trace and lowering durations from
`jax.monitoring`; with `--compile`, `lowered.compile()` too. Also the
program's size: jaxpr equations (all levels) and StableHLO lines. Prints a
markdown table of medians and the paired ratios (boxwood / pure JAX, per
round), with the load average.

`--platform tpu` lowers both steps for a TPU from this machine (JAX lowers
Pallas kernels to Mosaic without the chip): splash attention, not in interpret
mode (the child reports its backend as `tpu` to the kernels' choice), with
`BOXWOOD_ON_ERROR=nan` (a host callback, the token-id check, cannot be lowered
for another backend) and boxwood's step function under a plain `jax.jit`
(`filter_jit`'s `lower` takes no platform; on the CPU it lowers as fast as
`jax.jit`). No compile. `--unroll` unrolls boxwood's blocks (`with_unroll(True)`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REMAT = "dots_with_no_batch_dims_saveable"


def _eqns(jaxpr) -> int:
    n = 0
    for e in jaxpr.eqns:
        n += 1
        for p in e.params.values():
            for q in p if isinstance(p, tuple | list) else (p,):
                inner = getattr(q, "jaxpr", q)
                if hasattr(inner, "eqns"):
                    n += _eqns(inner)
    return n


def _plain_jit_step(boxwood_step: Any, model: Any) -> tuple[Any, Any]:
    """`boxwood_step` (`_acc_boxwood.step_function`'s, a `filter_jit`) as its
    function under a plain `jax.jit` of the model's arrays (abstract ones, from
    `abstract_step`): `(step, params)`."""
    import jax

    import boxwood as bw

    leaf = lambda x: isinstance(x, jax.Array | jax.ShapeDtypeStruct)  # noqa: E731
    params, static = bw.partition(model, leaf)
    inner = boxwood_step.__wrapped__

    @jax.jit
    def step(ids: Any, params: Any, state: Any) -> tuple:
        new, state, value = inner(ids, bw.combine(params, static), state)
        return bw.partition(new, bw.is_array)[0], state, value

    return step, params


def child(
    who: str,
    quick: bool,
    compile_too: bool,
    loss: str = "chunked",
    platform: str = "cpu",
    unroll: bool = False,
) -> dict:
    sys.path.insert(0, str(HERE))
    import jax

    if (
        platform == "tpu"
    ):  # the kernels' choice reads the backend: Mosaic, not interpret
        jax.default_backend = lambda: "tpu"  # type: ignore[assignment]
    import jax.numpy as jnp
    import optax

    import _acc_boxwood
    import _acc_cases as cases
    import _acc_jax
    import boxwood as bw

    durations = {"trace": 0.0, "lower": 0.0}
    names = {"/jax/core/compile/jaxpr_trace_duration": "trace",
             "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}  # fmt: skip

    def listen(event: str, seconds: float, **_: object) -> None:
        if event in names:
            durations[names[event]] += seconds

    jax.jit(lambda x: (x @ x.T).sum()).lower(jnp.ones((4, 4))).compile()
    case = cases.train_cases(quick)["gpt2"]
    optimiser = optax.adamw(**_acc_boxwood.OPTIMISER)
    kind = "splash" if platform == "tpu" else "xla"
    raw = None
    if who == "jax":
        ids = jax.ShapeDtypeStruct((case.batch, case.seq), jnp.int32)
        params = jax.eval_shape(
            lambda: _acc_jax.INITS["gpt2"](
                case.options, jax.random.key(0), jnp.bfloat16
            )
        )
        step = _acc_jax.train_step("gpt2", case.options, kind, REMAT, optimiser)
        args = (ids, params, jax.eval_shape(optimiser.init, params))
        raw = step
    elif platform == "tpu":
        _, (ids, model, state) = _acc_boxwood.abstract_step(
            case, kind, REMAT, unroll or 1
        )
        boxwood_step = _acc_boxwood.step_function(optimiser, loss)
        step, params = _plain_jit_step(boxwood_step, model)
        args = (ids, params, state)
        raw = step
    else:
        step, args = _acc_boxwood.abstract_step(case, "xla", REMAT, unroll or 1)
        step = _acc_boxwood.step_function(optimiser, loss)
    jax.monitoring.register_event_duration_secs_listener(listen)
    wall, cpu = time.perf_counter(), time.process_time()
    if platform == "tpu":
        lowered = step.trace(*args).lower(lowering_platforms=("tpu",))
    else:
        lowered = step.lower(*args)
    row = {"who": who, "lower_wall_s": time.perf_counter() - wall,
           "lower_cpu_s": time.process_time() - cpu, **{f"{k}_s": v for k, v in durations.items()}}  # fmt: skip
    if compile_too:
        wall, cpu = time.perf_counter(), time.process_time()
        lowered.compile()
        row["compile_wall_s"] = time.perf_counter() - wall
        row["compile_cpu_s"] = time.process_time() - cpu
    row["stablehlo_lines"] = lowered.as_text().count("\n")
    if raw is not None:
        jaxpr = jax.make_jaxpr(getattr(raw, "__wrapped__", raw))(*args)
    else:
        jaxpr = bw.filter_make_jaxpr(step.__wrapped__)(*args)[0]
    row["jaxpr_eqns"] = _eqns(jaxpr.jaxpr)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="a JSON file of the rows")
    p.add_argument("--loss", default="chunked", help="boxwood's loss: chunked or whole")
    p.add_argument("--platform", default="cpu", choices=("cpu", "tpu"),
                   help="lower for this platform (tpu: from this machine, no compile)")  # fmt: skip
    p.add_argument("--unroll", action="store_true", help="boxwood's blocks unrolled")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.platform == "tpu" and args.compile:
        p.error("--compile needs the platform's device: not with --platform tpu")
    if args.child:
        row = child(args.child, args.quick, args.compile, args.loss, args.platform,
                    args.unroll)  # fmt: skip
        print("ROW " + json.dumps(row))
        return 0
    load_before = os.getloadavg()
    rows = []
    for r in range(args.rounds):
        for who in ("boxwood", "jax") if r % 2 == 0 else ("jax", "boxwood"):
            command = [sys.executable, __file__, "--child", who]
            command += ["--quick"] * args.quick + ["--compile"] * args.compile
            command += ["--loss", args.loss, "--platform", args.platform]
            command += ["--unroll"] * args.unroll
            env = dict(os.environ)
            if args.platform == "tpu":  # no host callback: see the docstring
                env["BOXWOOD_ON_ERROR"] = "nan"
            out = subprocess.run(
                command, capture_output=True, text=True, check=True, env=env
            ).stdout
            row = json.loads(
                next(x for x in out.splitlines() if x.startswith("ROW "))[4:]
            )
            rows.append(row | {"round": r})
            print(f"round {r} {who}: {row}", file=sys.stderr, flush=True)
    fields = ["lower_wall_s", "lower_cpu_s", "trace_s", "lower_s"]
    fields += ["compile_wall_s", "compile_cpu_s"] * args.compile
    lines = [f"load average {load_before} before, {os.getloadavg()} after; "
             f"{args.rounds} rounds, medians", "",
             "| figure | boxwood | pure JAX | boxwood / pure JAX (median of rounds) |",
             "|---|---|---|---|"]  # fmt: skip
    for f in fields + ["jaxpr_eqns", "stablehlo_lines"]:
        mine = [x[f] for x in rows if x["who"] == "boxwood"]
        theirs = [x[f] for x in rows if x["who"] == "jax"]
        ratios = [a / b for a, b in zip(mine, theirs, strict=True) if b]
        lines.append(
            f"| {f} | {statistics.median(mine):.3f} | {statistics.median(theirs):.3f} | "
            f"{statistics.median(ratios):.3f}x |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
