"""Figure: pretrained models. A GPT-2-small-shaped model (124M parameters, random
weights written by `transformers`' `save_pretrained`; a 4-layer, 256-wide one with
`--quick`):

- loading: `boxwood.models.from_pretrained` against `transformers`' own
  `from_pretrained` on the same directory and against reading the same file with
  `safetensors.numpy.load_file` (the floor: it only reads);
- greedy generation of 64 tokens after a 32-token prompt: tokens per second against
  `transformers` eager PyTorch, and the time to the first token in a fresh process
  (`generate(prompt, 1)`: compile included), without and with JAX's persistent
  compilation cache;
- a forward pass of 8 x 128 tokens: `filter_jit(jax.vmap(model))` against the same
  model written as a plain function over a dict of arrays under `jax.jit` (the
  limit).

PyTorch runs on as many threads as XLA's CPU client (the cores this process may use),
set once before anything is timed, and every row records that count and the load
average taken just before its section ran: a figure from a busy machine says so.

    python benchmarks/run.py --only models [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import boxwood
import boxwood.models as bm
from _timing import interleave, interleave_once, median, row, timing_rows

FIGURE = "pretrained models (GPT-2)"


def _save_checkpoint(directory: str, quick: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    size = dict(n_layer=4, n_embd=256, n_head=4) if quick else {}
    config = transformers.GPT2Config(**size)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)


def _load_rows(directory: str, reps: int) -> list[dict]:
    import torch  # noqa: F401
    import transformers
    from safetensors.numpy import load_file

    file = os.path.join(directory, "model.safetensors")

    def timed(load) -> dict:
        start = time.perf_counter()
        jax.block_until_ready(load())
        return {"load": time.perf_counter() - start}

    runners = {
        "boxwood.models.from_pretrained": lambda: timed(
            lambda: bm.from_pretrained(directory)
        ),
        "transformers from_pretrained": lambda: timed(
            lambda: transformers.GPT2LMHeadModel.from_pretrained(directory)
        ),
        "safetensors.numpy.load_file": lambda: timed(lambda: load_file(file)),
    }
    results = interleave_once(runners, reps=reps)
    times = {name: median(r["load"]) for name, r in results.items()}
    rows = []
    for name, seconds in times.items():
        rows.append(
            row(
                FIGURE, "load 124M-parameter checkpoint", name, "time", seconds * 1e3, "ms",
                ratio=seconds / times["transformers from_pretrained"],
                ratio_to="transformers from_pretrained",
                note=f"{seconds / times['safetensors.numpy.load_file']:.2f}x load_file",
                samples=[s * 1e3 for s in results[name]["load"]],
            )
        )  # fmt: skip
    return rows


def _generation_rows(directory: str, reps: int) -> list[dict]:
    import torch
    import transformers

    model = bm.from_pretrained(directory)
    reference = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    prompt = np.random.RandomState(0).randint(0, model.config.vocab_size, 32)
    ids = jnp.asarray(prompt)

    def ours() -> dict:
        start = time.perf_counter()
        jax.block_until_ready(bm.generate(model, ids, 64))
        return {"t": time.perf_counter() - start}

    def theirs() -> dict:
        start = time.perf_counter()
        with torch.no_grad():
            reference.generate(
                torch.tensor(prompt)[None], max_new_tokens=64, min_new_tokens=64,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        return {"t": time.perf_counter() - start}

    results = interleave_once(
        {"boxwood": ours, "transformers eager": theirs}, reps=reps
    )
    rates = {name: 64 / median(r["t"]) for name, r in results.items()}
    return [
        row(
            FIGURE,
            "greedy generation, 32 + 64 tokens",
            name,
            "tokens/s",
            rate,
            "tok/s",
            ratio=rate / rates["transformers eager"],
            ratio_to="transformers eager",
            samples=[64 / s for s in results[name]["t"]],
        )  # fmt: skip
        for name, rate in rates.items()
    ]


_FIRST_TOKEN = r"""
import sys, time
start = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm
if sys.argv[2]:
    boxwood.enable_compilation_cache(sys.argv[2])
model = bm.from_pretrained(sys.argv[1])
loaded = time.perf_counter()
ids = jnp.asarray(np.arange(32) + 5)
jax.block_until_ready(bm.generate(model, ids, 1))
print("RESULT", time.perf_counter() - loaded, loaded - start)
"""


def _first_token_rows(directory: str) -> list[dict]:
    def child(cache: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_TOKEN, directory, cache],
            capture_output=True, text=True, check=True, env=dict(os.environ),
        )  # fmt: skip
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][-1]
        return float(line.split()[1])

    with tempfile.TemporaryDirectory() as cache:
        cold = child("")
        child(cache)  # fills the cache
        warm = child(cache)
    return [
        row(FIGURE, "time to first token (fresh process)", "boxwood, compile included",
            "time", cold * 1e3, "ms"),
        row(FIGURE, "time to first token (fresh process)", "boxwood, compilation cache",
            "time", warm * 1e3, "ms", ratio=warm / cold, ratio_to="compile included"),
    ]  # fmt: skip


def _plain_forward(
    params: dict, ids: jax.Array, n_layer: int, n_head: int
) -> jax.Array:
    """GPT-2 written as one function over a dict of arrays (boxwood's names and
    layouts), batched: the limit a module-based model can reach."""

    def ln(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * params[name + ".weight"] + params[
            name + ".bias"
        ]

    def dense(x, name):
        return (
            x @ params[name + ".weight"] + params[name + ".bias"]
        )  # Conv1D: (in, out)

    batch, seq = ids.shape
    x = params["transformer.wte.weight"][ids] + params["transformer.wpe.weight"][:seq]
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    for i in range(n_layer):
        p = f"transformer.h.{i}"
        q, k, v = jnp.split(dense(ln(x, p + ".ln_1"), p + ".attn.c_attn"), 3, axis=-1)
        q, k, v = (t.reshape(batch, seq, n_head, -1) for t in (q, k, v))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        weights = jax.nn.softmax(jnp.where(causal, logits, -1e30), axis=-1)
        h = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, -1)
        x = x + dense(h, p + ".attn.c_proj")
        h = jax.nn.gelu(dense(ln(x, p + ".ln_2"), p + ".mlp.c_fc"), approximate=True)
        x = x + dense(h, p + ".mlp.c_proj")
    return ln(x, "transformer.ln_f") @ params["transformer.wte.weight"].T


def _forward_rows(directory: str, reps: int) -> list[dict]:
    model = bm.from_pretrained(directory)
    params = {k: jnp.asarray(v) for k, v in boxwood.state_dict(model).items()}
    ids = jnp.asarray(
        np.random.RandomState(1).randint(0, model.config.vocab_size, (8, 128))
    )
    ours = boxwood.filter_jit(jax.vmap(model))
    c = model.config
    plain = jax.jit(lambda p, i: _plain_forward(p, i, c.n_layer, c.n_head))
    error = float(jnp.abs(ours(ids) - plain(params, ids)).max())
    runners = {
        "boxwood": lambda n: jax.block_until_ready([ours(ids) for _ in range(n)]),
        "plain jax.jit": lambda n: jax.block_until_ready(
            [plain(params, ids) for _ in range(n)]
        ),
    }
    results = interleave(runners, reps=reps, target_s=0.5, min_calls=1, max_calls=20)
    rows = timing_rows(
        FIGURE,
        "forward 8 x 128 tokens",
        results,
        limit="plain jax.jit",
        scale=1e3,
        unit="ms",
    )
    rows[0]["note"] = f"max |difference| to the plain function {error:.1e}"
    return rows


def _threads() -> int:
    """XLA's CPU client runs on every core this process may use; PyTorch is given
    the same number."""
    import torch

    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    return cores


def run(quick: bool) -> list[dict]:
    reps = 2 if quick else 3
    threads = _threads()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as directory:
        _save_checkpoint(directory, quick)
        sections = (
            lambda: _load_rows(directory, reps),
            lambda: _generation_rows(directory, reps),
            lambda: _first_token_rows(directory),
            lambda: _forward_rows(directory, reps),
        )
        for section in sections:
            load = json.dumps(os.getloadavg())
            for r in section():
                r["load_average"] = load
                r["threads"] = threads
                rows.append(r)
    return rows
