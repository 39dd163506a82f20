"""boxwood's side of `benchmarks/accelerator.py` (and `train_curve.py`), run
inside a fresh process: the models built as docs/models.md shows
(`boxwood.cast_floating` to bfloat16, `with_remat`, `with_unroll`,
`with_attention_implementation`,
`boxwood.models.causal_lm_loss`, a `filter_jit` step with optax AdamW and donated
model and optimiser state), and greedy generation with `boxwood.models.generate`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

import boxwood as bw
import boxwood.models as bm
from _acc_cases import TrainCase

OPTIMISER = dict(learning_rate=3e-4, weight_decay=0.1)


def remat_argument(remat: str) -> Any:
    """The command line's `--remat` as `with_remat` takes it."""
    return None if remat == "none" else remat


def with_attention(model: Any, kind: str) -> Any:
    """`model` with the attention implementation of the run: `"xla"`, or
    `"splash"` where this boxwood has it (a clear error where it does not)."""
    try:
        return model.with_attention_implementation(kind)
    except ValueError as error:
        if kind != "splash":
            raise
        raise RuntimeError(
            "the installed boxwood has no 'splash' attention implementation "
            f"(with_attention_implementation('splash') said: {str(error).splitlines()[0]}); "
            "run with --attention xla"
        ) from None


def has_splash() -> bool:
    """Whether this boxwood's models take `with_attention_implementation("splash")`."""
    config = bm.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    model = bw.filter_eval_shape(
        lambda: bm.GPT2LMHeadModel(config, key=jax.random.key(0))
    )
    try:
        model.with_attention_implementation("splash")
    except (ValueError, TypeError):
        return False
    return True


# The hand-written contenders have no dropout: boxwood's models are built with
# rates of zero, so the programs compared compute the same thing.
NO_DROPOUT = {
    "gpt2": dict(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0),
    "llama": dict(attention_dropout=0.0),
}


def build(case_name: str, options: dict, key: int = 0, dropout: bool = False) -> Any:
    """The float32 model, randomly initialised from a config (dropout off, or
    where `dropout` GPT-2's config rates of 0.1 on the embeddings and the
    residual branches)."""
    # attention-probability dropout forms the weights explicitly (no fused
    # kernel): the dropout figures keep the rates of the embeddings and the
    # residual branches only, so that they measure the masks
    options = {
        **options,
        **(dict(attn_pdrop=0.0) if dropout else NO_DROPOUT[case_name]),
    }
    if case_name == "gpt2":
        return bm.GPT2LMHeadModel(bm.GPT2Config(**options), key=jax.random.key(key))
    return bm.LlamaForCausalLM(bm.LlamaConfig(**options), key=jax.random.key(key))


def prepared(
    case_name: str,
    options: dict,
    kind: str,
    remat: str,
    dtype: Any,
    unroll: int | bool = 1,
    dropout: bool = False,
) -> Any:
    """The model of a step: `dtype`, `remat`, attention `kind`, and its blocks
    looped over as `unroll` says (`1`: scanned; `True`: unrolled, no scan)."""
    model = bw.cast_floating(build(case_name, options, dropout=dropout), dtype)
    model = model.with_remat(remat_argument(remat))
    if (
        unroll is True or unroll != 1
    ):  # (True == 1); the default program stays as measured
        model = model.with_unroll(unroll)
    return with_attention(model, kind)


def whole_logits_loss(model: Any, ids: jax.Array, *, key: Any = None) -> jax.Array:
    """The hand-written step's loss: the whole logits of `jax.vmap(model)`, the
    log-softmax in float32."""
    if key is None:
        logits = jax.vmap(lambda row: model(row))(ids)
    else:
        keys = jax.random.split(key, ids.shape[0])
        logits = jax.vmap(lambda row, k: model(row, key=k))(ids, keys)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()


LOSSES = {"chunked": bm.causal_lm_loss, "whole": whole_logits_loss}


def step_function(optimiser: Any, loss: str = "chunked") -> Any:
    """`step(ids, model, state, key=None)`: `key` is the dropout key (a model in
    training mode with dropout)."""
    value_and_grad = bw.filter_value_and_grad(LOSSES[loss])

    @bw.filter_jit(donate="all-except-first")
    def step(ids: jax.Array, model: Any, state: Any, key: Any = None) -> tuple:
        loss, grads = value_and_grad(model, ids, key=key)
        params = bw.filter(model, bw.is_inexact_array)
        updates, state = optimiser.update(grads, state, params)
        return bw.apply_updates(model, updates), state, loss

    return step


def trainer(
    case: TrainCase,
    kind: str,
    remat: str,
    ids: jax.Array,
    unroll: int | bool = 1,
    loss: str = "chunked",
    dropout: str | None = None,
) -> tuple:
    """`(run, info)`: `run(n)` takes `n` training steps and returns the last loss
    (ready); `unroll` as `prepared` takes it; `loss` `"chunked"`
    (`causal_lm_loss`) or `"whole"`; `dropout` `None` (off) or the generator of
    the masks (`"rbg"`, `"threefry"`), a new key each step."""
    model = prepared(
        case.name, case.options, kind, remat, jnp.bfloat16, unroll, dropout is not None
    )
    optimiser = optax.adamw(**OPTIMISER)
    state = optimiser.init(bw.filter(model, bw.is_inexact_array))
    step = step_function(optimiser, loss)
    carry: list[Any] = [model, state, None]
    base, count = jax.random.key(5), [0]
    if dropout is not None:
        bw.nn.set_dropout_generator(dropout)

    def key() -> Any:
        count[0] += 1
        return None if dropout is None else jax.random.fold_in(base, count[0])

    def run(n: int) -> Any:
        for _ in range(n):
            carry[0], carry[1], carry[2] = step(ids, carry[0], carry[1], key())
        return jax.block_until_ready(carry[2])

    def lowered_text() -> str:
        return step.lower(ids, carry[0], carry[1], key()).as_text()

    return run, {"lowered_text": lowered_text}


def abstract_step(
    case: TrainCase, kind: str, remat: str, unroll: int | bool = 1
) -> tuple:
    """`(step, args)`: the training step of `trainer` with its arguments as abstract
    arrays (`jax.ShapeDtypeStruct`, from `filter_eval_shape`), to compile without
    allocating (`step.lower(*args).compile()`); `unroll` as `prepared` takes it."""
    optimiser = optax.adamw(**OPTIMISER)

    def model_and_state() -> tuple:
        model = prepared(case.name, case.options, kind, remat, jnp.bfloat16, unroll)
        return model, optimiser.init(bw.filter(model, bw.is_inexact_array))

    model, state = bw.filter_eval_shape(model_and_state)
    ids = jax.ShapeDtypeStruct((case.batch, case.seq), jnp.int32)
    return step_function(optimiser), (ids, model, state)


def generation_model(options: dict) -> Any:
    return bw.cast_floating(build("gpt2", options), jnp.bfloat16)


def generate(model: Any, prompt: jax.Array, new_tokens: int) -> jax.Array:
    return bm.generate(model, prompt, new_tokens)


def remat_choice(case: TrainCase, kind: str, ids: jax.Array) -> Any:
    """`boxwood.models.choose_remat` of the training step of `trainer`."""
    model = prepared(case.name, case.options, kind, "none", jnp.bfloat16)
    optimiser = optax.adamw(**OPTIMISER)
    state = optimiser.init(bw.filter(model, bw.is_inexact_array))
    step = step_function(optimiser)
    return bm.choose_remat(lambda m, s, i: step(i, m, s), model, state, ids)[1]
