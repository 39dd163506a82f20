"""`generate`: autoregressive decoding of one prompt or a batch, with a key/value
cache held in a `boxwood.nn.State`, compiled once per (batch size, prompt length
bucket, new-token bucket, sampling mode)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from .._jit import filter_jit
from ._beam_search import beam_search, check_beams
from ._generate_layout import bucket, joined, layout
from ._generate_loop import Batch, Options, Stream, decode_loop, end_slots
from ._generate_output import GenerateOutput
from ._inputs import check_input_ids, warn_right_padding
from ._sampling import (
    check_sampling,
    count,
    default_pad_id,
    end_ids,
    token_id,
)
from ._score_rules import Rules, check_rules, stop_rows

_decode: Callable[..., tuple] = filter_jit(decode_loop)  # (NumPy or JAX arrays)


class _FromModel:
    """`eos_token_id`'s default: the model's `generation_config.json`'s."""

    def __repr__(self) -> str:
        return "<the end tokens of the model's generation_config.json>"


FROM_MODEL: Any = _FromModel()


def generate(
    model: Any,
    input_ids: Int[Array, " seq"] | Int[Array, "batch seq"] | np.ndarray | list,
    max_new_tokens: int,
    *,
    key: PRNGKeyArray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    min_new_tokens: int = 0,
    stop_sequences: list[list[int]] | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    output_scores: bool = False,
    eos_token_id: int | list[int] | tuple[int, ...] | None = FROM_MODEL,
    pad_token_id: int | None = None,
    callback: Callable[[Any], Any] | None = None,
    attention_mask: Any = None,
) -> Int[Array, " total"] | Int[Array, "batch total"] | GenerateOutput:
    """Continue a prompt, or a batch of prompts, with a causal language model.

    The prompts are run once (prefill) and each new token then costs one step over
    a key/value cache, held as a `boxwood.nn.State` (`model.init_cache`). The
    whole loop is one compiled program per (batch size, prompt length bucket,
    `max_new_tokens` bucket, sampling mode, options used): prompt lengths and
    `max_new_tokens` are padded to the next power of two (at least 16); the
    prompt's bucket is at most the model's number of positions. A batch is given
    as an argument, not by `jax.vmap(generate)` (which is not supported). Every
    option below is applied inside that one program, as `transformers`'
    `generate` applies the option of the same name.

    **Arguments:**

    - `model`: a [`boxwood.models.GPT2LMHeadModel`][] or
      [`boxwood.models.LlamaForCausalLM`][] (or a Llama variant).
    - `input_ids`: one prompt, shape `(seq,)` (an array or a list of ints); a
      batch of prompts of one length, `(batch, seq)`; or a list of prompts (1-D
      arrays or lists of ints) of any lengths, which are left-padded and masked.
    - `max_new_tokens`: the most tokens to add to each prompt.
    - `key`: a `jax.random` key; needed when `temperature > 0`. (Keyword only.)
    - `temperature`: `0` for greedy decoding (the most likely token each step, as
      `transformers`' `generate(do_sample=False)`); otherwise logits are divided by
      it and the token is sampled.
    - `top_k`: if given, sample only among the `top_k` most likely tokens.
    - `top_p`: if given, in `(0, 1]`: sample only among the most likely tokens
      whose probabilities (after `temperature` and `top_k`) add up to `top_p`
      (nucleus sampling; the most likely token is always kept). `top_k` and
      `top_p` apply to sampling only; greedy decoding ignores them.
    - `repetition_penalty`: above 1, discourages every token already in the row
      (its prompt and its new tokens): a positive score is divided by it, a
      negative one multiplied. `1.0`: off.
    - `no_repeat_ngram_size`: if above 0, no n-gram of this size occurs twice in
      a row (prompt and new tokens): a token that would complete one already
      there is never chosen. `0`: off.
    - `min_new_tokens`: no end token (`eos_token_id`) is chosen before this many
      new tokens. `0`: off.
    - `stop_sequences`: a list of token-id sequences (`[[13, 13], [50256]]`): a
      row whose tokens end with one of them (its last new token completing it)
      stops as at an end token, keeping the sequence.
    - `num_beams`: above 1, beam search with this many beams per prompt
      (`transformers`' beam search, token for token); greedy only
      (`temperature=0`), no `callback`.
    - `length_penalty`: beam search: a finished beam's score is its summed
      log-probability divided by `new_tokens ** length_penalty` (above 0 favours
      longer ones).
    - `early_stopping`: beam search: `True` stops a prompt's search once it has
      `num_beams` finished beams; `False` (default) once no running beam can
      beat them by the `transformers` estimate; `"never"` by the exact bound.
    - `num_return_sequences`: how many sequences per prompt (the best beams, in
      order; with sampling, independent draws). At most `num_beams` with beam
      search; greedy decoding returns one.
    - `output_scores`: if `True`, return a [`boxwood.models.GenerateOutput`][]
      with the scores and log-probabilities (below) instead of the tokens.
    - `eos_token_id`: an end token id, or a sequence of them. A row that emits one
      keeps it and stops: its later positions hold `pad_token_id`, and the loop
      ends early once every row has stopped. `None`: no early stop. Default:
      the `eos_token_id` of the model's `generation_config.json` (read by
      `from_pretrained` where the directory has one, as `transformers`'
      `generate` defaults to it), ids outside the vocabulary passed over;
      without one, no early stop (pass `model.config.eos_token_id` to stop at
      the model's end token).
    - `pad_token_id`: the id that fills the left of shorter prompts in a batch and
      the positions after a row's end token. Default: the `pad_token_id` of
      the model's `generation_config.json`, else the config's `pad_token_id`,
      else its `eos_token_id` (the first), else `0`.
    - `callback`: called on the host with each new token as it is produced (a
      Python `int` for one prompt; for a batch, a NumPy `(batch,)` int32 array
      with `pad_token_id` in rows that have stopped), so a notebook can print as
      it goes. It runs on the host while the compiled loop waits (an ordered
      `jax.experimental.io_callback`), so any callback shares the compiled code.
      If it raises, no more tokens are made and `generate` raises its exception.
    - `attention_mask`: for `input_ids` already padded to one length, as a
      tokenizer returns them: `1` for real tokens, `0` for padding, of
      `input_ids`' shape (`(batch, seq)`, or `(seq,)` for one prompt); left or
      right padding. It must be concrete (a NumPy or JAX array, or nested lists),
      hold only 0 and 1, and each row's ones must be contiguous with at least
      one. Each row's real tokens are taken as its prompt, and the batch is then
      generated as a list of prompts (below); the ids under the padding are
      ignored. (Keyword only.)

    **Returns:** for one prompt, the prompt followed by the new tokens,
    `(seq + max_new_tokens,)`; for a batch, `(batch, longest + max_new_tokens)`,
    each row its prompt left-padded with `pad_token_id` to the longest prompt's
    length, followed by its new tokens. int32. With greedy decoding each row
    equals generating its prompt alone (with `dynamic` RoPE scaling, rows share
    the longest row's frequencies, as in `transformers`). With `attention_mask`,
    `longest` is the most ones in a row, and rows come back in this left-padded
    layout whichever side the input was padded on: every row's new tokens start
    at column `longest`, and its prompt ends there. With `num_return_sequences`
    above 1, each prompt's sequences are consecutive rows (`(n, total)` for one
    prompt, `(batch * n, total)` for a batch), as in `transformers`. With
    `output_scores=True`, a [`boxwood.models.GenerateOutput`][] holding these
    tokens as `sequences`.
    """
    name = _causal_lm_name(model)
    # dropout off: generation is inference (switched inside the compiled loop)
    vocab = model.config.vocab_size
    prompts, single = (
        _prompts(name, input_ids, vocab, pad_token_id)
        if attention_mask is None
        else _masked_prompts(name, input_ids, attention_mask, vocab)
    )
    max_new_tokens = count("max_new_tokens", max_new_tokens)
    mode = check_sampling(temperature, top_k, top_p, key, vocab)
    rules = check_rules(repetition_penalty, no_repeat_ngram_size, min_new_tokens)
    beams = check_beams(
        num_beams, length_penalty, early_stopping, num_return_sequences, mode
    )
    stops = stop_rows(stop_sequences, vocab)
    ends, pad_id = _end_and_pad(model.config, eos_token_id, pad_token_id, vocab)
    _check_callback(callback, beams)
    _check_positions(model, prompts, max_new_tokens)
    if beams is None:  # sampled sequences: each prompt repeated
        prompts = [p for p in prompts for _ in range(num_return_sequences)]
    padded, pads, start = layout(name, model, prompts, pad_id)
    knobs = _knobs(temperature, top_p, repetition_penalty, min_new_tokens, mode)
    batch = Batch(
        padded, pads, np.int32(start), np.int32(max_new_tokens), knobs,
        end_slots(ends), stops, np.int32(pad_id),
    )  # fmt: skip
    capacity = min(bucket(max_new_tokens), model.max_positions)
    call = _Call(
        model, prompts, single, num_return_sequences, batch, max_new_tokens,
        pad_id, capacity, rules, output_scores,
    )  # fmt: skip
    if beams is not None:
        return _beam_search(call, beams)
    key = key if key is not None else _unused_key()
    return _decoded(call, key, mode, callback)


class _Call(NamedTuple):
    """A `generate` call's checked arguments and its prompts laid out."""

    model: Any
    prompts: list[np.ndarray]
    single: bool
    returned: int  # num_return_sequences
    batch: Batch  # the compiled loop's data, host arrays
    steps: int  # max_new_tokens
    pad_id: int
    capacity: int
    rules: Rules
    output_scores: bool


def _knobs(
    temperature: Any, top_p: Any, penalty: Any, min_new: Any, mode: Any
) -> np.ndarray:
    """The values of the call that are data of the compiled loop (`Knobs`), in
    one host array: one transfer, not one device array each."""
    temperature = temperature if not mode.greedy else 1.0
    return np.asarray([temperature, top_p or 1.0, penalty, min_new], np.float32)


def _decoded(call: _Call, key: Any, mode: Any, callback: Any) -> Array | GenerateOutput:
    """Greedy decoding or sampling: the tokens, or with their scores."""
    one = call.single and call.returned == 1
    options = Options(
        mode, call.rules, call.batch.stops is not None, call.output_scores,
        callback is not None,
    )  # fmt: skip
    with Stream(callback, one) as stream:
        new, ran, scores, log_probs = _decode(
            call.model, call.batch, key, stream.id, call.capacity, options
        )
        new = np.asarray(new)[:, : call.steps]
    tokens = joined(call.prompts, new, call.pad_id, one)
    if not call.output_scores:
        return tokens
    scores = scores[:, : int(ran)]
    log_probs = log_probs[:, : call.steps]
    if one:
        scores, log_probs = scores[0], log_probs[0]
    return GenerateOutput(tokens, scores, log_probs, None)


def _beam_search(call: _Call, beams: Any) -> Array | GenerateOutput:
    """Beam search: each prompt's best `num_return_sequences` beams, in
    consecutive rows, or with their scores."""
    new, sequence_scores = beam_search(
        call.model, call.batch, call.capacity, beams, call.rules
    )
    n = call.returned
    new = new[:, :n].reshape(-1, new.shape[-1])
    one = call.single and n == 1
    prompts = [p for p in call.prompts for _ in range(n)]
    tokens = joined(prompts, new, call.pad_id, one)
    if not call.output_scores:
        return tokens
    sequence_scores = sequence_scores[:, :n].reshape(-1)
    sequence_scores = sequence_scores[0] if one else sequence_scores
    return GenerateOutput(tokens, None, None, jnp.asarray(sequence_scores))


def _end_and_pad(
    config: Any, eos_token_id: Any, pad_token_id: Any, vocab: int
) -> tuple[tuple[int, ...], int]:
    """The end ids and the pad id of a call, checked, from their defaults
    where not given."""
    eos_token_id, pad_token_id = _generation_defaults(
        config, eos_token_id, pad_token_id, vocab
    )
    pad_id = (
        default_pad_id(config, vocab)
        if pad_token_id is None
        else token_id("pad_token_id", pad_token_id, vocab)
    )
    return end_ids(eos_token_id, vocab), pad_id


def _check_positions(model: Any, prompts: list, max_new_tokens: int) -> None:
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.max_positions:
        raise ValueError(
            f"`generate`: {longest} prompt tokens + `max_new_tokens`={max_new_tokens} "
            f"exceed the model's {model.max_positions} positions."
        )


def _check_callback(callback: Any, beams: Any) -> None:
    if callback is not None and not callable(callback):
        raise TypeError(
            f"`generate`: `callback` must be a function of the new tokens, got "
            f"{callback!r}."
        )
    if callback is not None and beams is not None:
        raise ValueError(
            "`generate`: `callback` streams the tokens of greedy decoding or "
            "sampling; beam search (`num_beams` > 1) knows its tokens only at the "
            "end. Leave out `callback`, or use `num_beams=1`."
        )


@functools.cache
def _unused_key() -> PRNGKeyArray:
    """The key greedy decoding passes (made once: making one runs on the device)."""
    return jax.random.key(0)


def _generation_defaults(
    config: Any, eos_token_id: Any, pad_token_id: Any, vocab: int
) -> tuple:
    """`eos_token_id` and `pad_token_id`, each defaulting (where `None`) to the
    model's `generation_config.json`'s, where it was loaded with one; ids there
    outside the vocabulary are passed over, as the config's are for the pad."""
    generation = getattr(config, "generation_config", None) or {}

    def within(value: Any) -> bool:
        return isinstance(value, int) and 0 <= value < vocab

    if eos_token_id is FROM_MODEL:
        ends = generation.get("eos_token_id")
        ends = ends if isinstance(ends, list) else [ends]
        eos_token_id = [e for e in ends if within(e)] or None
    if pad_token_id is None and within(generation.get("pad_token_id")):
        pad_token_id = generation["pad_token_id"]
    return eos_token_id, pad_token_id


def _causal_lm_name(model: Any) -> str:
    name = type(model).__name__
    if not hasattr(model, "init_cache"):
        raise TypeError(
            f"`generate` takes a causal language model (GPT2LMHeadModel, "
            f"LlamaForCausalLM), got {name}."
        )
    return name


_SHAPES = (
    "one prompt `(seq,)`, a batch `(batch, seq)` of prompts of one length, or a "
    "list of prompts (1-D arrays or lists of ints)"
)


def _prompts(
    name: str, input_ids: Any, vocab: int, pad_token_id: Any
) -> tuple[list[np.ndarray], bool]:
    """The prompts as 1-D host arrays, checked, and whether there was one; a
    batch whose rows end with `pad_token_id` warned of (right padding)."""
    prompts, single = _unmasked_prompts(name, input_ids, vocab)
    if not single:
        warn_right_padding(prompts, pad_token_id)
    return prompts, single


def _unmasked_prompts(
    name: str, input_ids: Any, vocab: int
) -> tuple[list[np.ndarray], bool]:
    if isinstance(input_ids, list | tuple):
        if not input_ids:
            raise ValueError(
                f"`generate`: `input_ids` is an empty list; give {_SHAPES}."
            )
        if all(np.ndim(p) == 0 for p in input_ids):
            return [_prompt(name, np.asarray(input_ids), vocab)], True
        rows = [_batch_row(name, i, p, vocab) for i, p in enumerate(input_ids)]
        return rows, False
    if isinstance(input_ids, jax.Array) and not isinstance(input_ids, jax.core.Tracer):
        input_ids = np.asarray(input_ids)  # one transfer, not one per row
    ndim = np.ndim(input_ids)
    if ndim == 1:
        return [_prompt(name, input_ids, vocab)], True
    if ndim == 2:
        return [_batch_row(name, i, p, vocab) for i, p in enumerate(input_ids)], False
    raise ValueError(
        f"`generate`: `input_ids` must be {_SHAPES}; got shape {np.shape(input_ids)}."
    )


def _masked_prompts(
    name: str, input_ids: Any, attention_mask: Any, vocab: int
) -> tuple[list[np.ndarray], bool]:
    """The real tokens of each row of padded `input_ids`, by `attention_mask`."""
    if isinstance(attention_mask, jax.core.Tracer):
        raise TypeError(
            "`generate`: `attention_mask` must be concrete (a NumPy or JAX array, "
            "or lists), not traced: `generate` lays its prompts out on the host."
        )
    try:
        ids = np.asarray(input_ids)
        mask = np.asarray(attention_mask)
    except ValueError:
        raise ValueError(
            "`generate`: with `attention_mask`, `input_ids` and `attention_mask` "
            "must be padded to one length, shape `(batch, seq)` or `(seq,)`; a "
            "list of prompts of different lengths needs no `attention_mask`."
        ) from None
    if ids.ndim not in (1, 2) or mask.shape != ids.shape:
        raise ValueError(
            "`generate`: `attention_mask` must have the shape of `input_ids`, "
            f"`(batch, seq)` or `(seq,)`; got {mask.shape} for `input_ids` of "
            f"shape {ids.shape}."
        )
    if ids.ndim == 1:
        return [_prompt(name, _real_tokens(0, ids, mask), vocab)], True
    rows = [_real_tokens(i, row, m) for i, (row, m) in enumerate(zip(ids, mask))]
    return [_batch_row(name, i, row, vocab) for i, row in enumerate(rows)], False


def _real_tokens(i: int, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row `i`'s ids where its mask is 1 (one contiguous run)."""
    if mask.dtype != np.bool_ and not np.isin(mask, (0, 1)).all():
        bad = mask[~np.isin(mask, (0, 1))][0].item()
        raise ValueError(
            f"`generate`: `attention_mask` must hold only 0 (padding) and 1 (real "
            f"tokens); row {i} holds {bad!r}."
        )
    real = np.flatnonzero(mask)
    if real.size == 0:
        raise ValueError(
            f"`generate`: row {i} of `attention_mask` is all 0; every prompt needs "
            "at least one real token."
        )
    if real[-1] - real[0] + 1 != real.size:
        raise ValueError(
            f"`generate`: the ones of row {i} of `attention_mask` are not "
            "contiguous; give left or right padding only (the real tokens in one "
            "run), or pass the prompts as a list."
        )
    return ids[real[0] : real[-1] + 1]


def _prompt(name: str, ids: Any, vocab: int) -> np.ndarray:
    ids = np.asarray(ids)
    if np.ndim(ids) == 1 and np.shape(ids)[0] == 0:
        raise ValueError("`generate`: `input_ids` is empty; give at least one token.")
    check_input_ids(name, ids, None, vocab)
    return np.asarray(ids, np.int32)


def _batch_row(name: str, i: int, ids: Any, vocab: int) -> np.ndarray:
    if np.ndim(ids) != 1:
        raise ValueError(
            f"`generate`: prompt {i} of `input_ids` has shape {np.shape(ids)}; each "
            "prompt of a batch must be 1-D (a list or array of token ids)."
        )
    if np.shape(ids)[0] == 0:
        raise ValueError(
            f"`generate`: prompt {i} of `input_ids` is empty; every prompt needs at "
            "least one token."
        )
    return _prompt(f"{name}, prompt {i}", ids, vocab)
