"""`generate`'s rules on the next-token scores, `transformers`' logits processors
of the same names (`repetition_penalty`, `no_repeat_ngram_size`,
`min_new_tokens`), its stop sequences, and the checks of these arguments. The
rules read each row's tokens so far, held in the loop as `Tokens`."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ._sampling import count, is_number, token_id


@dataclasses.dataclass(frozen=True)
class Rules:
    """Which rules apply, fixed at compile time; `penalty` and `min_new` are
    values of the program (`Knobs`), `ngram` is a size (a shape)."""

    penalty: bool = False
    ngram: int = 0
    min_new: bool = False


class Tokens(NamedTuple):
    """Each row's tokens so far, in cache-slot order: `ids[r, lo[r]:pos]` (the
    prompt, then the new tokens; left padding before `lo`, unwritten slots after
    `pos`, the slot of the next token)."""

    ids: Int[Array, "rows slots"]
    lo: Int[Array, " rows"]
    pos: Int[Array, ""]

    def valid(self) -> Bool[Array, "rows slots"]:
        slots = jnp.arange(self.ids.shape[1])
        return (slots[None, :] >= self.lo[:, None]) & (slots[None, :] < self.pos)

    def written(self, token: Int[Array, " rows"]) -> Tokens:
        """With `token` at `pos`, and `pos` one further."""
        ids = jax.lax.dynamic_update_index_in_dim(self.ids, token, self.pos, 1)
        return Tokens(ids, self.lo, self.pos + 1)


def apply_rules(
    scores: Float[Array, "rows vocab"],
    tokens: Tokens,
    new: Int[Array, ""],
    penalty: Float[Array, ""],
    min_new: Float[Array, ""],
    ends: Int[Array, " slots"],
    rules: Rules,
) -> Float[Array, "rows vocab"]:
    """`scores` after the rules, in `transformers`' order: the repetition
    penalty, then the ban of repeated n-grams, then no end token before `new`
    (the number of new tokens so far) reaches `min_new`."""
    vocab = scores.shape[-1]
    if rules.penalty:
        seen = _mark(tokens.ids, tokens.valid(), vocab)
        hit = jnp.where(scores < 0, scores * penalty, scores / penalty)
        scores = jnp.where(seen, hit, scores)
    if rules.ngram:
        scores = jnp.where(_repeats(tokens, rules.ngram, vocab), -jnp.inf, scores)
    if rules.min_new:
        ended = is_end(jnp.arange(vocab), ends)[None, :]
        early = new.astype(jnp.float32) < min_new
        scores = jnp.where(early & ended, -jnp.inf, scores)
    return scores


def _mark(ids: Array, where: Array, vocab: int) -> Bool[Array, "rows vocab"]:
    """Per row, the tokens of `ids` at the slots `where` holds."""
    rows = jnp.arange(ids.shape[0])[:, None]
    slot = jnp.where(where, ids, vocab)  # out of range: dropped
    return jnp.zeros((ids.shape[0], vocab), bool).at[rows, slot].set(True, mode="drop")


def _repeats(tokens: Tokens, n: int, vocab: int) -> Bool[Array, "rows vocab"]:
    """The tokens that would repeat an `n`-gram of the row: those that followed an
    earlier occurrence of its last `n - 1` tokens."""
    ids, width = tokens.ids, tokens.ids.shape[1]
    if n > width:  # no n-gram fits in the row
        return jnp.zeros((ids.shape[0], vocab), bool)
    starts = jnp.arange(width - n + 1)  # the n-gram at slots start .. start + n - 1
    # the last n - 1 tokens; where fewer than n real tokens exist, no n-gram is
    # complete and `ends_before` is false for every start (the slice is unused)
    last = jax.lax.dynamic_slice_in_dim(ids, tokens.pos - (n - 1), n - 1, axis=1)
    same = jnp.ones((ids.shape[0], width - n + 1), bool)
    for k in range(n - 1):
        same &= ids[:, k : k + width - n + 1] == last[:, k : k + 1]
    ends_before = (starts[None, :] >= tokens.lo[:, None]) & (
        starts[None, :] + n - 1 < tokens.pos
    )
    return _mark(ids[:, n - 1 :], same & ends_before, vocab)


def is_end(tokens: Int[Array, "..."], ends: Int[Array, " slots"]) -> Array:
    """Per token, whether it is one of the end ids `ends` (-1 in an unused slot)."""
    ends = ends.reshape((1,) * tokens.ndim + ends.shape)
    return (tokens[..., None] == ends).any(axis=-1)


def stopped(tokens: Tokens, stops: Int[Array, "sequences length"]) -> Array:
    """Per row, whether its tokens end with one of the stop sequences (each
    right-aligned in a row of `stops`, -1 before it; an unused row all -1)."""
    length = stops.shape[1]
    slots = tokens.pos - length + jnp.arange(length)
    tail = jnp.take(tokens.ids, jnp.clip(slots, 0), axis=1)  # (rows, length)
    real = slots[None, :] >= tokens.lo[:, None]
    fits = (stops[None] < 0) | ((tail[:, None] == stops[None]) & real[:, None])
    used = (stops >= 0).any(axis=-1)
    return (fits.all(axis=-1) & used[None]).any(axis=-1)


# -- argument checks ------------------------------------------------------------


def check_rules(
    repetition_penalty: Any, no_repeat_ngram_size: Any, min_new_tokens: Any
) -> Rules:
    """The rules of valid arguments, or an error naming the bad one."""
    if not is_number(repetition_penalty):
        raise TypeError(
            "`generate`: `repetition_penalty` must be a positive number (1.0 for "
            f"none), got {repetition_penalty!r}."
        )
    if not 0 < repetition_penalty < float("inf"):
        raise ValueError(
            "`generate`: `repetition_penalty` must be a positive finite number (1.0 "
            f"for none; above 1 discourages repeats), got {repetition_penalty!r}."
        )
    ngram = count("no_repeat_ngram_size", no_repeat_ngram_size, least=0)
    min_new = count("min_new_tokens", min_new_tokens, least=0)
    return Rules(repetition_penalty != 1, ngram, min_new > 0)


def stop_rows(stop_sequences: Any, vocab_size: int) -> np.ndarray | None:
    """`stop_sequences` (a list of lists of token ids) right-aligned in the rows
    of an int32 array, -1 before each; rows and columns padded to powers of two
    (at least 4) so that nearby counts and lengths share one compiled loop."""
    if stop_sequences is None:
        return None
    if not isinstance(stop_sequences, list | tuple) or not stop_sequences:
        raise TypeError(
            "`generate`: `stop_sequences` must be a non-empty list of token id "
            f"sequences, e.g. `[[13, 13], [50256]]`; got {stop_sequences!r}."
        )
    sequences = []
    for i, sequence in enumerate(stop_sequences):
        if isinstance(sequence, np.ndarray | jax.Array):
            sequence = np.asarray(sequence).tolist()
        if not isinstance(sequence, list | tuple) or not sequence:
            raise TypeError(
                f"`generate`: `stop_sequences[{i}]` must be a non-empty list of "
                f"token ids, got {sequence!r}; give `[[id, ...], ...]` (a single "
                "token: `[[id]]`, or `eos_token_id`)."
            )
        name = f"stop_sequences[{i}]"
        sequences.append([token_id(name, t, vocab_size) for t in sequence])
    rows = max(4, 1 << (len(sequences) - 1).bit_length())
    longest = max(len(s) for s in sequences)
    out = np.full((rows, max(4, 1 << (longest - 1).bit_length())), -1, np.int32)
    for row, sequence in zip(out, sequences):
        row[out.shape[1] - len(sequence) :] = sequence
    return out
