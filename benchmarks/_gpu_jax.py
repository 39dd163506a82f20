"""boxwood's side of `benchmarks/gpu.py`, run inside a fresh process
(`_gpu_child.py`): the device's bf16 matmul peak, the training step, greedy
generation. Every function returns result rows (`_timing.row`)."""

from __future__ import annotations

import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import boxwood as bw
import boxwood.models as bm
from _gpu_cases import GENERATE, TRAIN, GenerateCase, TrainCase, throughput_rows
from _gpu_timing import Compiles, repeat, steady_time
from _timing import row


def matmul_peak(size: int, reps: int) -> dict:
    """bf16 TFLOP/s of `size`-square products, 10 chained per timed batch."""
    keys = jax.random.split(jax.random.key(0), 2)
    a, b = (jax.random.normal(k, (size, size), jnp.bfloat16) for k in keys)
    chain = jax.jit(lambda a, b: [a @ (b + i) for i in range(10)])
    jax.block_until_ready(chain(a, b))

    def run() -> None:
        jax.block_until_ready(chain(a, b))

    seconds = repeat(run, reps) / 10
    return {"size": size, "tflops": 2 * size**3 / seconds / 1e12}


def _cast(model: Any) -> tuple[Any, str]:
    """bf16 parameters: `boxwood.cast_floating` where boxwood has it."""
    cast = getattr(bw, "cast_floating", None)
    if cast is not None:
        try:
            out = cast(model, jnp.bfloat16)
            dtypes = {
                x.dtype for x in jax.tree.leaves(bw.filter(out, bw.is_inexact_array))
            }
            if dtypes == {jnp.dtype(jnp.bfloat16)}:
                return out, "boxwood.cast_floating(model, bfloat16)"
            why = f"it left dtypes {sorted(map(str, dtypes))}"
        except Exception as error:  # noqa: BLE001 - reported, then the fallback
            why = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    else:
        why = "boxwood has no cast_floating"
    out = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if bw.is_inexact_array(x) else x, model
    )
    return out, f"jax.tree.map(astype(bfloat16)) ({why})"


def build(case: TrainCase) -> tuple[Any, str]:
    if case.name == "gpt2":
        model = bm.GPT2LMHeadModel(bm.GPT2Config(**case.options), key=jax.random.key(0))
    else:
        model = bm.LlamaForCausalLM(
            bm.LlamaConfig(**case.options), key=jax.random.key(0)
        )
    return _cast(model)


def _plain_loss(model: Any, ids: jax.Array) -> jax.Array:
    """Next-token cross-entropy with the log-softmax in float32, as `transformers`'
    `model(ids, labels=ids).loss` (holds the float32 logits of the whole batch)."""
    logits = jax.vmap(model)(ids)[:, :-1].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()


def _loss_forms(helper: Any) -> dict[str, Any]:
    """The calling conventions `causal_lm_loss` may have, tried in order."""
    return {
        "causal_lm_loss(model, ids)": lambda m, ids: helper(m, ids),
        "vmap(causal_lm_loss(model, ids_row)).mean()": lambda m, ids: jax.vmap(
            lambda row_ids: helper(m, row_ids)
        )(ids).mean(),
    }


def loss_function(model: Any, ids: jax.Array) -> tuple[Any, str]:
    """`boxwood.models.causal_lm_loss` if boxwood has it and one of its calling
    forms gives a scalar on this model; otherwise the plain loss. Returns the loss
    and a label saying which was used (and why not the helper)."""
    helper = getattr(bm, "causal_lm_loss", None)
    if helper is None:
        return (
            _plain_loss,
            "plain float32 log-softmax (boxwood.models has no causal_lm_loss)",
        )
    errors = []
    for label, form in _loss_forms(helper).items():
        try:
            out = jax.eval_shape(lambda form=form: form(model, ids))
            if getattr(out, "shape", None) == ():
                return form, f"boxwood.models.{label}"
            errors.append(f"{label}: shape {getattr(out, 'shape', out)}")
        except Exception as error:  # noqa: BLE001 - reported, then the next form
            errors.append(
                f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:100]}"
            )
    return (
        _plain_loss,
        "plain float32 log-softmax (causal_lm_loss not usable: "
        + "; ".join(errors)
        + ")",
    )


def _step(loss: Any, optimiser: Any) -> Any:
    @bw.filter_jit(donate="all-except-first")
    def step(ids: jax.Array, model: Any, state: Any) -> tuple:
        value, grads = bw.filter_value_and_grad(loss)(model, ids)
        params = bw.filter(model, bw.is_inexact_array)
        updates, state = optimiser.update(grads, state, params)
        return bw.apply_updates(model, updates), state, value

    return step


def train(case: TrainCase, reps: int, target_s: float, cold: bool) -> list[dict]:
    """The training step: its first call (cold or from the persistent cache), then
    (cold process only) steady-state tokens/s."""
    import optax

    model, cast_label = build(case)
    params = sum(x.size for x in jax.tree.leaves(bw.filter(model, bw.is_inexact_array)))
    vocab = case.options["vocab_size"]
    ids = jax.random.randint(jax.random.key(1), (case.batch, case.seq), 0, vocab)
    loss, loss_label = loss_function(model, ids)
    optimiser = optax.adamw(3e-4, weight_decay=0.1)
    state = optimiser.init(bw.filter(model, bw.is_inexact_array))
    step = _step(loss, optimiser)
    carry = [model, state, None]

    def run(n: int) -> None:
        for _ in range(n):
            carry[0], carry[1], carry[2] = step(ids, carry[0], carry[1])
        jax.block_until_ready(carry[2])

    with Compiles() as compiles:
        start = time.perf_counter()
        run(1)
        first = time.perf_counter() - start
    extra: dict[str, Any] = dict(
        params=params, flops_per_token=case.flops_per_token(params)
    )
    extra.update(loss=loss_label, cast=cast_label, tokens_per_step=case.tokens)
    mode = "cold" if cold else "persistent cache"
    rows = [
        row(TRAIN, case.title, "boxwood", f"first step, {mode}", first, "s",
            note=compiles.note(), **compiles.fields(), **extra),
    ]  # fmt: skip
    if cold:
        per_step, samples = steady_time(run, reps, target_s)
        rows += throughput_rows(TRAIN, case, "boxwood", per_step, samples, extra)
        rows[-1]["final_loss"] = float(carry[2])
        rows[0]["host_callbacks"] = host_callbacks(
            step.lower(ids, carry[0], carry[1]).as_text()
        )
    return rows


def host_callbacks(text: str) -> list[str]:
    """The host-callback custom calls in a lowered program: JAX does not write a
    program holding one to its persistent compilation cache."""
    return sorted(set(re.findall(r"custom_call @(\w*callback\w*)", text)))


def _prompt(case: GenerateCase, batch: int, vocab: int) -> np.ndarray:
    ids = np.random.RandomState(0).randint(0, vocab, (batch, case.prompt))
    return ids.astype(np.int32)


def generate(case: GenerateCase, directory: str, reps: int, cold: bool) -> list[dict]:
    """Time to the first token (`generate(prompt, 1)`: compile included, in this
    fresh process), then the warm time to first token and tokens/s."""
    model = bm.from_pretrained(directory, dtype=jnp.bfloat16)
    rows: list[dict] = []
    for batch in case.batches:
        prompt = _prompt(case, batch, model.config.vocab_size)
        ids = jnp.asarray(prompt[0] if batch == 1 else prompt)
        title = f"batch {batch}, {case.prompt} + {case.new_tokens} tokens"
        try:
            with Compiles() as compiles:
                start = time.perf_counter()
                np.asarray(bm.generate(model, ids, 1))
                first = time.perf_counter() - start
        except Exception as error:  # noqa: BLE001 - batch 32 needs batched generate
            why = f"not available: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
            rows.append(
                row(GENERATE, title, "boxwood", "tokens/s", None, "tok/s", note=why)
            )
            continue
        mode = "cold" if cold else "persistent cache"
        fields: dict[str, Any] = compiles.fields()
        rows.append(row(GENERATE, title, "boxwood", f"time to first token, fresh process, {mode}",
                        first * 1e3, "ms", note=compiles.note(), **fields))  # fmt: skip
        if cold:
            rows += _generation_rates(model, ids, case, batch, title, reps)
    return rows


def _generation_rates(
    model: Any, ids: jax.Array, case: GenerateCase, batch: int, title: str, reps: int
) -> list[dict]:
    out = np.asarray(bm.generate(model, ids, case.new_tokens))  # compiles
    times = {"ttft": [], "gen": []}
    for _ in range(reps):
        start = time.perf_counter()
        np.asarray(bm.generate(model, ids, 1))
        times["ttft"].append(time.perf_counter() - start)
        start = time.perf_counter()
        np.asarray(bm.generate(model, ids, case.new_tokens))
        times["gen"].append(time.perf_counter() - start)
    n = batch * case.new_tokens
    gen = float(np.median(times["gen"]))
    first_row = out.reshape(batch, -1)[0, case.prompt :].tolist()
    return [
        row(GENERATE, title, "boxwood", "tokens/s", n / gen, "tok/s",
            samples=[n / t for t in times["gen"]], tokens=first_row),
        row(GENERATE, title, "boxwood", "time to first token, warm",
            float(np.median(times["ttft"])) * 1e3, "ms",
            samples=[t * 1e3 for t in times["ttft"]]),
    ]  # fmt: skip
