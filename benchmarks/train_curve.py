"""The loss curve of a GPT-2 training run with boxwood and with the hand-written
pure-JAX GPT-2 (`_acc_jax.py`), from the same initial parameters (boxwood's,
copied into the pure-JAX tree), on the same batches, with the same optimiser:
the two curves should overlap. Reports the largest difference.

    python benchmarks/train_curve.py --quick     # tiny GPT-2, CPU, about a minute
    python benchmarks/train_curve.py             # GPT-2-small, 300 steps of 8 x 512
    python benchmarks/train_curve.py --dtype bfloat16 --out DIR

The corpus is text shipped with boxwood itself: the package's own `.py` and
`.md` files, read as bytes (token ids 0 to 255; nothing is downloaded). Batches
are windows at positions drawn from a seeded NumPy generator. boxwood's step is
docs/models.md's recipe (`boxwood.models.causal_lm_loss`, `filter_jit` with
donation, optax AdamW); the pure-JAX step takes the log-softmax of the whole
logits, the same function computed in another order. Both use XLA's
`jax.nn.dot_product_attention` and no rematerialisation. Writes
`train_curve.json` (both curves) and `train_curve.md` into `--out` (default
`benchmarks/results/`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _acc_cases as cases  # noqa: E402


def corpus() -> bytes:
    """boxwood's own source and READMEs, in a fixed order."""
    import boxwood

    root = Path(boxwood.__file__).resolve().parent
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".md"))
    return b"\n".join(p.read_bytes() for p in files)


def batches(data: bytes, steps: int, batch: int, seq: int, seed: int) -> Any:
    """`(steps, batch, seq)` int32 token ids: windows of `data` at seeded offsets."""
    import numpy as np

    tokens = np.frombuffer(data, np.uint8).astype(np.int32)
    starts = np.random.default_rng(seed).integers(0, len(tokens) - seq, (steps, batch))
    return tokens[starts[..., None] + np.arange(seq)]


def _options(quick: bool) -> dict:
    if quick:
        return dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128)
    return cases.gpt2_options(False)


def _curve(step: Any, carry: list, data: Any) -> tuple[list[float], float]:
    """The losses of `len(data)` steps (read at the end), and seconds per step
    after the first."""
    import jax
    import jax.numpy as jnp

    losses = []
    start = time.perf_counter()
    for i, ids in enumerate(data):
        carry[0], carry[1], loss = step(jnp.asarray(ids), carry[0], carry[1])
        losses.append(loss)
        if i == 0:
            jax.block_until_ready(loss)
            start = time.perf_counter()
    jax.block_until_ready(losses[-1])
    per_step = (time.perf_counter() - start) / max(len(data) - 1, 1)
    return [float(x) for x in losses], per_step


def run(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import _acc_boxwood
    import _acc_jax
    import boxwood as bw

    dtype = jnp.dtype(args.dtype)
    options = _options(args.quick)
    batch, seq = (
        args.batch or (8 if args.quick else 8),
        args.seq or (64 if args.quick else 512),
    )
    steps = args.steps or (200 if args.quick else 300)
    data = batches(corpus(), steps, batch, seq, args.seed)
    model = bw.cast_floating(_acc_boxwood.build("gpt2", options, key=args.seed), dtype)
    model = model.with_attention_implementation("xla")
    params = _acc_jax.from_boxwood_gpt2(
        model
    )  # copies: the boxwood step donates its own
    optimiser = optax.adamw(args.lr, weight_decay=0.1)

    ours, ours_s = _curve(_acc_boxwood.step_function(optimiser),
                          [model, optimiser.init(bw.filter(model, bw.is_inexact_array))], data)  # fmt: skip
    del model
    step = _acc_jax.train_step("gpt2", options, "xla", None, optimiser)
    theirs, theirs_s = _curve(step, [params, optimiser.init(params)], data)
    diff = np.abs(np.array(ours) - np.array(theirs))
    worst = int(diff.argmax())
    return dict(
        options=options, batch=batch, seq=seq, steps=steps, lr=args.lr, dtype=str(dtype),
        seed=args.seed, corpus_bytes=len(corpus()), boxwood=ours, pure_jax=theirs,
        max_abs_diff=float(diff.max()), max_abs_diff_step=worst,
        max_rel_diff=float((diff / np.maximum(np.abs(theirs), 1e-12)).max()),
        seconds_per_step={"boxwood": ours_s, "pure JAX": theirs_s},
        backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
        jax=jax.__version__,
    )  # fmt: skip


def markdown(result: dict, quick: bool) -> str:
    o = result["options"]
    ours, theirs = result["boxwood"], result["pure_jax"]
    lines = [
        f"# benchmarks/train_curve.py on {result['device_kind']} ({result['backend']}), "
        f"{result['date']}",
        "",
        *(["**Quick run: a tiny GPT-2.**", ""] if quick else []),
        f"- GPT-2 {o['n_layer']} layers x {o['n_embd']} ({o['n_head']} heads, vocabulary "
        f"{o['vocab_size']}), {result['dtype']} parameters, batch {result['batch']} x "
        f"{result['seq']}, {result['steps']} steps of AdamW (lr {result['lr']}, weight decay "
        f"0.1), seed {result['seed']}; JAX {result['jax']}",
        f"- corpus: boxwood's own .py and .md files as bytes ({result['corpus_bytes']:,} bytes)",
        f"- **largest difference between the curves: {result['max_abs_diff']:.3g}** (step "
        f"{result['max_abs_diff_step']}; relative {result['max_rel_diff']:.3g})",
        f"- loss: first {ours[0]:.4f} (boxwood) / {theirs[0]:.4f} (pure JAX), last "
        f"{ours[-1]:.4f} / {theirs[-1]:.4f}",
        "- seconds per step after the first: "
        + ", ".join(
            f"{k} {v * 1e3:.1f} ms" for k, v in result["seconds_per_step"].items()
        ),
        "",
        "| step | boxwood | pure JAX | difference |",
        "|---|---|---|---|",
    ]
    every = max(len(ours) // 20, 1)
    for i in sorted({*range(0, len(ours), every), len(ours) - 1}):
        lines.append(
            f"| {i} | {ours[i]:.4f} | {theirs[i]:.4f} | {ours[i] - theirs[i]:+.2e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny GPT-2 (for a CPU)")
    p.add_argument(
        "--steps", type=int, default=None, help="training steps (300; quick 200)"
    )
    p.add_argument("--batch", type=int, default=None, help="sequences per step (8)")
    p.add_argument(
        "--seq", type=int, default=None, help="tokens per sequence (512; quick 64)"
    )
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW's learning rate")
    p.add_argument("--dtype", default="float32", help="the parameters' dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    result = run(args)
    now = datetime.datetime.now(datetime.timezone.utc)
    result["date"] = now.isoformat(timespec="seconds")
    text = markdown(result, args.quick)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_curve.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "train_curve.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
