"""`generate`: autoregressive decoding with a key/value cache held in a
`boxwood.nn.State`, compiled once per (prompt length bucket, new tokens)."""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from .._jit import filter_jit
from ._layers import check_input_ids

# Prompts are padded to the next power of two (at least this), so that prompts of
# nearby lengths share one compiled program.
MIN_BUCKET = 16


def bucket(length: int) -> int:
    """The padded prompt length: the next power of two, at least `MIN_BUCKET`."""
    return max(MIN_BUCKET, 1 << (length - 1).bit_length())


def generate(
    model: Any,
    input_ids: Int[Array, " seq"],
    max_new_tokens: int,
    *,
    key: PRNGKeyArray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
) -> Int[Array, " total"]:
    """Continue a prompt with a causal language model.

    The prompt is run once (prefill) and each new token then costs one step over a
    key/value cache, held as a `boxwood.nn.State` (`model.init_cache`). The whole
    loop is one compiled program per (prompt length bucket, `max_new_tokens`,
    sampling mode): prompts are padded to the next power of two (at least 16, at
    most the model's number of positions).

    **Arguments:**

    - `model`: a [`boxwood.models.GPT2LMHeadModel`][] or
      [`boxwood.models.LlamaForCausalLM`][].
    - `input_ids`: the prompt's token ids, shape `(seq,)`, integers.
    - `max_new_tokens`: how many tokens to add (no early stop at an end token).
    - `key`: a `jax.random` key; needed when `temperature > 0`. (Keyword only.)
    - `temperature`: `0` for greedy decoding (the most likely token each step, as
      `transformers`' `generate(do_sample=False)`); otherwise logits are divided by
      it and the token is sampled.
    - `top_k`: if given, sample only among the `top_k` most likely tokens.

    **Returns:** the prompt followed by the new tokens, shape
    `(seq + max_new_tokens,)`, int32.
    """
    name = type(model).__name__
    if not hasattr(model, "init_cache"):
        raise TypeError(
            f"`generate` takes a causal language model (GPT2LMHeadModel, "
            f"LlamaForCausalLM), got {name}."
        )
    vocab_size = model.config.vocab_size
    check_input_ids(name, input_ids, None, vocab_size)
    max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
    greedy = _check_sampling(temperature, top_k, key, vocab_size)
    length = int(jnp.shape(input_ids)[0])
    if length == 0:
        raise ValueError("`generate`: `input_ids` is empty; give at least one token.")
    if length + max_new_tokens > model.max_positions:
        raise ValueError(
            f"`generate`: {length} prompt tokens + `max_new_tokens`={max_new_tokens} "
            f"exceed the model's {model.max_positions} positions."
        )
    # The bucket never exceeds the position table (a prompt fits in it, above).
    padded = np.zeros(min(bucket(length), model.max_positions), np.int32)
    padded[:length] = np.asarray(input_ids)
    new = _decode(
        model, jnp.asarray(padded), jnp.int32(length), key if key is not None else jax.random.key(0),
        jnp.float32(temperature if not greedy else 1.0), max_new_tokens, greedy, top_k,
    )  # fmt: skip
    # Joined on the host: a device concatenation would compile once per length.
    return jnp.asarray(
        np.concatenate([np.asarray(input_ids, np.int32), np.asarray(new)])
    )


def _positive_int(name: str, value: Any) -> int:
    try:
        if isinstance(value, bool):  # an int to Python, but never meant as a count
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(
            f"`generate`: `{name}` must be an int, got {value!r}."
        ) from None
    if value < 1:
        raise ValueError(f"`generate`: `{name}` must be at least 1, got {value}.")
    return value


def _check_sampling(temperature: Any, top_k: Any, key: Any, vocab_size: int) -> bool:
    if isinstance(temperature, bool) or not isinstance(
        temperature, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            "`generate`: `temperature` must be a number (0 for greedy decoding), "
            f"got {temperature!r}."
        )
    if not 0 <= temperature < float("inf"):
        raise ValueError(
            "`generate`: `temperature` must be 0 (greedy decoding) or a positive "
            f"finite number (sampling), got {temperature!r}."
        )
    if top_k is not None and _positive_int("top_k", top_k) > vocab_size:
        raise ValueError(
            f"`generate`: `top_k` = {top_k} is larger than the vocabulary "
            f"({vocab_size} tokens); give at most {vocab_size}, or `None` for all."
        )
    greedy = temperature == 0
    if not greedy and key is None:
        raise ValueError("`generate`: sampling (`temperature > 0`) needs `key=`.")
    return greedy


def _pick(
    logits: Array, key: Array, temperature: Array, greedy: bool, top_k: int | None
) -> Array:
    logits = logits.astype(jnp.float32)
    if greedy:
        return jnp.argmax(logits).astype(jnp.int32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits / temperature).astype(jnp.int32)


@filter_jit
def _decode(
    model: Any,
    padded: Array,
    length: Array,
    key: Array,
    temperature: Array,
    max_new_tokens: int,
    greedy: bool,
    top_k: int | None,
) -> Array:
    state = model.init_cache(padded.shape[0] + max_new_tokens)
    logits, state = model.decode(padded, state, 0)
    keys = jax.random.split(key, max_new_tokens)
    first = _pick(logits[length - 1], keys[0], temperature, greedy, top_k)

    def step(carry: tuple, key: Array) -> tuple:
        token, position, state = carry
        logits, state = model.decode(token[None], state, position)
        new = _pick(logits[0], key, temperature, greedy, top_k)
        return (new, position + 1, state), token

    (last, _, _), tokens = jax.lax.scan(step, (first, length, state), keys[1:])
    return jnp.concatenate([tokens, last[None]])
