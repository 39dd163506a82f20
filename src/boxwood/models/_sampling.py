"""`generate`'s choice of the next token (greedy, temperature, top-k, top-p) and
the checks of its sampling and token-id arguments."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The sampling mode, fixed at compile time: greedy or not, `top_k` (a shape)
    and whether `top_p` filters at all (its value is an argument of the program,
    so changing it does not recompile)."""

    greedy: bool
    top_k: int | None
    nucleus: bool


def count(name: str, value: Any, least: int = 1) -> int:
    """`value` as an int of at least `least` (1 for a count; 0 for an option that
    0 turns off), or an error naming `name`."""
    if isinstance(value, bool):  # an int to Python, but never meant as a count
        raise TypeError(f"`generate`: `{name}` must be an int, got {value!r}.")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(
            f"`generate`: `{name}` must be an int, got {value!r}."
        ) from None
    if value < least and least == 0:
        raise ValueError(
            f"`generate`: `{name}` must be at least 0 (0 turns it off), got {value}."
        )
    if value < least:
        raise ValueError(f"`generate`: `{name}` must be at least {least}, got {value}.")
    return value


def check_sampling(
    temperature: Any, top_k: Any, top_p: Any, key: Any, vocab_size: int
) -> Sampling:
    """The sampling mode of valid arguments, or an error naming the bad one."""
    if not is_number(temperature):
        raise TypeError(
            "`generate`: `temperature` must be a number (0 for greedy decoding), "
            f"got {temperature!r}."
        )
    if not 0 <= temperature < float("inf"):
        raise ValueError(
            "`generate`: `temperature` must be 0 (greedy decoding) or a positive "
            f"finite number (sampling), got {temperature!r}."
        )
    if top_k is not None and count("top_k", top_k) > vocab_size:
        raise ValueError(
            f"`generate`: `top_k` = {top_k} is larger than the vocabulary "
            f"({vocab_size} tokens); give at most {vocab_size}, or `None` for all."
        )
    if top_p is not None and not is_number(top_p):
        raise TypeError(
            f"`generate`: `top_p` must be a number in (0, 1] or `None`, got {top_p!r}."
        )
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(
            "`generate`: `top_p` must be in (0, 1] (the probability mass to sample "
            f"from; 1 or `None` for all tokens), got {top_p!r}."
        )
    greedy = temperature == 0
    if not greedy and key is None:
        raise ValueError("`generate`: sampling (`temperature > 0`) needs `key=`.")
    nucleus = not greedy and top_p is not None and top_p < 1
    # `top_k` is a shape of the program; the whole vocabulary filters nothing
    # (as in `transformers`), so it shares the program of no `top_k`
    if greedy or top_k == vocab_size:
        top_k = None
    return Sampling(greedy, top_k, nucleus)


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (a bool is not one)."""
    return not isinstance(value, bool) and isinstance(
        value, (int, float, np.integer, np.floating)
    )


def token_id(name: str, value: Any, vocab_size: int) -> int:
    """`value` as a token id in `[0, vocab_size)`, or an error naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"`generate`: `{name}` must be an int token id (or, for `eos_token_id`, "
            f"a sequence of them), got {value!r}."
        )
    if not 0 <= value < vocab_size:
        raise ValueError(
            f"`generate`: `{name}` must be a token id from 0 to {vocab_size - 1} "
            f"(the vocabulary has {vocab_size} tokens), got {value}."
        )
    return int(value)


def end_ids(value: Any, vocab_size: int) -> tuple[int, ...]:
    """`eos_token_id` (None, an int or a sequence of ints) as a tuple of ids."""
    if value is None:
        return ()
    if isinstance(value, np.ndarray | jax.Array):
        value = np.asarray(value).tolist()
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not values:
        raise ValueError(
            "`generate`: `eos_token_id` is an empty sequence; give at least one id, "
            "or `None` for no early stop."
        )
    return tuple(token_id("eos_token_id", v, vocab_size) for v in values)


def default_pad_id(config: Any, vocab_size: int) -> int:
    """The config's `pad_token_id`, else its (first) `eos_token_id`, else 0; an id
    outside the vocabulary is passed over."""
    for candidate in (
        getattr(config, "pad_token_id", None),
        getattr(config, "eos_token_id", None),
    ):
        if isinstance(candidate, tuple | list):
            candidate = candidate[0] if candidate else None
        if isinstance(candidate, int) and 0 <= candidate < vocab_size:
            return candidate
    return 0


def warp(
    logits: Float[Array, "batch vocab"],
    temperature: Array,
    top_p: Array,
    mode: Sampling,
) -> Float[Array, "batch vocab"]:
    """The scores sampling draws from, as `transformers`' warpers make them: the
    logits divided by `temperature`, kept (others `-inf`) to the `top_k` largest,
    then to the smallest set holding `top_p` of the probability. Greedy decoding
    uses the logits as they are."""
    if mode.greedy:
        return logits
    logits = logits / temperature
    if mode.top_k is not None:
        kth = jax.lax.top_k(logits, mode.top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if mode.nucleus:
        logits = jnp.where(logits < _nucleus_floor(logits, top_p), -jnp.inf, logits)
    return logits


def draw(
    scores: Float[Array, "batch vocab"], key: Array, mode: Sampling
) -> Int[Array, " batch"]:
    """The next token of every row: the largest score, or a draw from the
    softmax of `scores`."""
    if mode.greedy:
        return jnp.argmax(scores, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, scores, axis=-1).astype(jnp.int32)


def pick(
    logits: Float[Array, "batch vocab"],
    key: Array,
    temperature: Array,
    top_p: Array,
    mode: Sampling,
) -> Int[Array, " batch"]:
    """The next token of every row from its logits (`warp`, then `draw`)."""
    scores = warp(logits.astype(jnp.float32), temperature, top_p, mode)
    return draw(scores, key, mode)


def _nucleus_floor(logits: Array, top_p: Array) -> Array:
    """Per row, the smallest logit of the nucleus. As `transformers` computes it:
    tokens ranked from the least likely up are dropped while the probability up
    to and including them is at most `1 - top_p`; the most likely always stays."""
    ranked = jnp.sort(logits, axis=-1)
    upto = jnp.cumsum(jax.nn.softmax(ranked, axis=-1), axis=-1)
    dropped = (upto <= 1 - top_p).at[:, -1].set(False)
    return jnp.min(jnp.where(dropped, jnp.inf, ranked), axis=-1, keepdims=True)
