"""Figure: pretrained models. A GPT-2-small-shaped model (124M parameters, random
weights written by `transformers`' `save_pretrained`; a 4-layer, 256-wide one with
`--quick`):

- loading, each load in a fresh process (5 round-robin repetitions; 2 with
  `--quick`), timed up to the end of a read of every byte of every weight (a sum
  of each array, so that a load that only maps the file pays for reading it):
  `boxwood.models.from_pretrained` of the file `transformers`' `save_pretrained`
  wrote (safetensors pads to 8 bytes; where its data happen to start 64-byte
  aligned, some tensors are mapped), of that file with its data moved 8 bytes off
  a 64-byte boundary (nothing mapped), and of the same weights written by
  boxwood's `save_pretrained` (every tensor 64-byte aligned: mapped, not copied),
  against `transformers`' `from_pretrained` and `safetensors.numpy.load_file` of
  each file;
- greedy generation of 64 tokens after a 32-token prompt: tokens per second against
  `transformers` eager PyTorch, and the time to the first token in a fresh process
  (`generate(prompt, 1)`: compile included), without and with JAX's persistent
  compilation cache (the row notes whether `generate`'s program was read from it);
- Python start to first logits: whole fresh processes timed from outside (import,
  load, `model(ids)` of 32 tokens), boxwood with JAX's persistent compilation
  cache against `transformers` eager PyTorch, alternating;
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
import shutil
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
from boxwood.models._stacking import layer_arrays

FIGURE = "pretrained models (GPT-2)"


def _save_checkpoint(directory: str, quick: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    size = dict(n_layer=4, n_embd=256, n_head=4) if quick else {}
    config = transformers.GPT2Config(**size)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)


# One load in a fresh process: imports first (not timed), then the load, then a
# read of every byte of every weight (a sum), so that a load that only maps the
# file pays for reading it too. Prints the two times in seconds.
_LOAD_CHILD = r"""
import json, os, sys, time
import numpy as np
kind, directory = sys.argv[1], sys.argv[2]
if kind == "transformers":
    import torch, transformers
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # as many as XLA's client
    model_class = transformers.GPT2LMHeadModel  # its lazy import, not timed
elif kind == "boxwood":
    import jax, boxwood.models as bm
    jax.devices()  # the CPU client started, not timed
else:
    from safetensors.numpy import load_file
start = time.perf_counter()
if kind == "boxwood":
    model = bm.from_pretrained(directory)
    arrays = [x for x in jax.tree.leaves(model) if isinstance(x, jax.Array)]
    jax.block_until_ready(arrays)
    arrays = [np.asarray(x) for x in arrays]  # views of the device buffers (CPU)
elif kind == "transformers":
    model = model_class.from_pretrained(directory)
    tensors = {t.data_ptr(): t for t in model.state_dict().values()}  # tied once
    arrays = [t.detach().numpy() for t in tensors.values()]
else:
    arrays = list(load_file(os.path.join(directory, "model.safetensors")).values())
loaded = time.perf_counter()
total = sum(float(a.sum(dtype=np.float64)) for a in arrays)
touched = time.perf_counter()
print("RESULT", json.dumps({"load": loaded - start, "touched": touched - start}))
"""


def _load_child(kind: str, directory: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_CHILD, kind, directory],
        capture_output=True, text=True, env=dict(os.environ),
    )  # fmt: skip
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode or not lines:
        raise RuntimeError(f"load child {kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _aligned_copy(directory: str, aligned: str) -> None:
    """`directory`'s checkpoint written again by boxwood's `save_pretrained`: every
    tensor 64-byte aligned, each parameter's layers back to back."""
    bm.save_pretrained(bm.from_pretrained(directory), aligned)


def _shifted_copy(directory: str, shifted: str) -> None:
    """`directory` with its `model.safetensors` header padded (JSON allows trailing
    spaces) so that the tensor data start 8 bytes past a 64-byte boundary: no
    tensor of it can be mapped, whatever the writer's own layout."""
    shutil.copytree(directory, shifted, dirs_exist_ok=True)
    path = os.path.join(directory, "model.safetensors")
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header, data = f.read(size), f.read()
    pad = (8 - (8 + len(header)) % 64) % 64
    header += b" " * pad
    with open(os.path.join(shifted, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + data)


def _load_rows(directory: str, reps: int, size: str) -> list[dict]:
    """Fresh-process loads, `reps` round-robin repetitions of every contender: the
    file `transformers` wrote (safetensors pads tensor data to 8 bytes only; where
    its data happen to start 64-byte aligned some of it can be mapped), that file
    with its data moved 8 bytes off a 64-byte boundary (nothing can be mapped),
    and the same weights written by boxwood (64-byte aligned)."""
    aligned = os.path.join(os.path.dirname(directory), "aligned")
    shifted = os.path.join(os.path.dirname(directory), "shifted")
    _aligned_copy(directory, aligned)
    _shifted_copy(directory, shifted)
    contenders = {
        "boxwood from_pretrained, 64-byte aligned file": ("boxwood", aligned),
        "boxwood from_pretrained, transformers' file": ("boxwood", directory),
        "boxwood from_pretrained, file 8 bytes off": ("boxwood", shifted),
        "transformers from_pretrained": ("transformers", directory),
        "safetensors.numpy.load_file, 64-byte aligned file": ("numpy", aligned),
        "safetensors.numpy.load_file, transformers' file": ("numpy", directory),
        "safetensors.numpy.load_file, file 8 bytes off": ("numpy", shifted),
    }
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in contenders}
    names = list(contenders)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            for metric, value in _load_child(*contenders[name]).items():
                samples[name].setdefault(metric, []).append(value)
    after = json.dumps(os.getloadavg())
    limit = median(samples["transformers from_pretrained"]["touched"])
    rows = []
    for name, got in samples.items():
        load, touched = median(got["load"]), median(got["touched"])
        same_file = "safetensors.numpy.load_file, " + name.partition(", ")[2]
        versus = ""
        if name.startswith("boxwood") and same_file in samples:
            theirs = median(samples[same_file]["touched"])
            versus = f"; {touched / theirs:.2f}x of load_file of the same file"
        rows.append(
            row(
                FIGURE, f"load a {size} checkpoint, fresh process, then read every weight",
                name, "time", touched * 1e3, "ms",
                ratio=touched / limit, ratio_to="transformers from_pretrained",
                note=f"load alone {load * 1e3:.0f} ms{versus}; load average after {after}",
                samples=[t * 1e3 for t in got["touched"]],
                load_samples=[t * 1e3 for t in got["load"]],
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
import logging, sys, time
start = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm
hits = []  # JAX logs each persistent-cache hit, naming the program
class Hits(logging.Handler):
    def emit(self, record):
        hits.append("cache hit for 'jit_decode_loop'" in record.getMessage())
compiler_log = logging.getLogger("jax._src.compiler")
compiler_log.addHandler(Hits())
compiler_log.setLevel(logging.DEBUG)
compiler_log.propagate = False
if sys.argv[2]:
    boxwood.enable_compilation_cache(sys.argv[2])
model = bm.from_pretrained(sys.argv[1])
loaded = time.perf_counter()
ids = jnp.asarray(np.arange(32) + 5)
jax.block_until_ready(bm.generate(model, ids, 1))
print("RESULT", time.perf_counter() - loaded, loaded - start, int(any(hits)))
"""


def _first_token_rows(directory: str) -> list[dict]:
    def child(cache: str) -> tuple[float, bool]:
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_TOKEN, directory, cache],
            capture_output=True, text=True, check=True, env=dict(os.environ),
        )  # fmt: skip
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][-1]
        return float(line.split()[1]), line.split()[3] == "1"

    with tempfile.TemporaryDirectory() as cache:
        cold, _ = child("")
        child(cache)  # fills the cache
        warm, hit = child(cache)
    note = (
        "generate's program read from the cache"
        if hit
        else "generate's program was NOT read from the cache"
    )
    return [
        row(FIGURE, "time to first token (fresh process)", "boxwood, compile included",
            "time", cold * 1e3, "ms"),
        row(FIGURE, "time to first token (fresh process)", "boxwood, compilation cache",
            "time", warm * 1e3, "ms", ratio=warm / cold, ratio_to="compile included",
            note=note),
    ]  # fmt: skip


# Python start to first logits in a fresh process: import, load, one forward of 32
# tokens, the result waited for. boxwood with JAX's persistent compilation cache
# (filled by an earlier process); `transformers` eager PyTorch, threads as XLA's.
_FIRST_LOGITS = {
    "boxwood": r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm
boxwood.enable_compilation_cache(sys.argv[2])
model = bm.from_pretrained(sys.argv[1])
jax.block_until_ready(model(jnp.asarray(np.arange(32, dtype=np.int32) + 5)))
""",
    "transformers": r"""
import os, sys
import torch, transformers
torch.set_num_threads(len(os.sched_getaffinity(0)))
model = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1])
with torch.no_grad():
    model(torch.arange(32).unsqueeze(0) + 5).logits.sum().item()
""",
}


def _first_logits_rows(directory: str, reps: int) -> list[dict]:
    """Wall time of whole fresh processes, measured from outside, alternating."""

    def child(kind: str, cache: str) -> float:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", _FIRST_LOGITS[kind], directory, cache],
            capture_output=True, check=True, env=dict(os.environ),
        )  # fmt: skip
        return time.perf_counter() - start

    samples: dict[str, list[float]] = {"boxwood": [], "transformers": []}
    with tempfile.TemporaryDirectory() as cache:
        child("boxwood", cache)  # fills the cache
        for rep in range(reps):
            for kind in sorted(samples, reverse=rep % 2 == 1):
                samples[kind].append(child(kind, cache))
    theirs = median(samples["transformers"])
    after = json.dumps(os.getloadavg())
    return [
        row(FIGURE, "Python start to first logits (fresh process, 32 tokens)",
            name, "time", median(got) * 1e3, "ms", ratio=median(got) / theirs,
            ratio_to="transformers", samples=[t * 1e3 for t in got],
            note=f"load average after {after}"
            + ("; compilation cache on" if name == "boxwood" else ""))
        for name, got in samples.items()
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
    # per-layer names (`transformer.h.0....`), as the checkpoint has them
    params = {k: jnp.asarray(v) for k, v in layer_arrays(model)}
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
    size = "4-layer, 256-wide" if quick else "124M-parameter"
    with tempfile.TemporaryDirectory() as root:
        directory = os.path.join(root, "transformers")
        _save_checkpoint(directory, quick)
        sections = (
            lambda: _load_rows(directory, 2 if quick else 5, size),
            lambda: _generation_rows(directory, reps),
            lambda: _first_token_rows(directory),
            lambda: _first_logits_rows(directory, reps + 2),
            lambda: _forward_rows(directory, reps),
        )
        for section in sections:
            load = json.dumps(os.getloadavg())
            for r in section():
                r["load_average"] = load
                r["threads"] = threads
                rows.append(r)
    return rows
