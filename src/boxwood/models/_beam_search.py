"""`generate`'s beam search: `transformers`' beam search (the same candidates,
scores, stopping rules and `early_stopping` heuristics, token for token) as one
compiled loop, and the checks of its arguments."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._jit import filter_jit
from ._generate_loop import Batch, Knobs, prefill
from ._id_ranges import ids_known_in_range
from ._sampling import Sampling, count, is_number
from ._score_rules import Rules, Tokens, apply_rules, is_end, stopped

# `transformers`' stand-in for "impossible": a finished or unused beam's score,
# added to candidates that may not be chosen (a float32 sum, as there).
NEVER = -1.0e9


@dataclasses.dataclass(frozen=True)
class Beams:
    """The beam search of a call. Only `num` (and the candidates kept per prompt
    each step, `keep`) are fixed at compile time; `length_penalty` and
    `early_stopping` reach the loop as data (`_divisors`, `when_full`)."""

    num: int
    early_stopping: bool | str
    length_penalty: float


def check_beams(
    num_beams: Any,
    length_penalty: Any,
    early_stopping: Any,
    num_return_sequences: Any,
    mode: Sampling,
) -> Beams | None:
    """The beam search of valid arguments (`None` for `num_beams=1`), or an error
    naming the bad one."""
    num = count("num_beams", num_beams)
    returned = count("num_return_sequences", num_return_sequences)
    if not (
        early_stopping is True or early_stopping is False or early_stopping == "never"
    ):
        raise ValueError(
            '`generate`: `early_stopping` must be `True`, `False` or `"never"` '
            f"(as in `transformers`), got {early_stopping!r}."
        )
    if not is_number(length_penalty) or not np.isfinite(length_penalty):
        raise TypeError(
            "`generate`: `length_penalty` must be a finite number (1.0: the mean "
            f"log-probability per new token), got {length_penalty!r}."
        )
    if num == 1:
        if returned > 1 and mode.greedy:
            raise ValueError(
                f"`generate`: `num_return_sequences`={returned} with greedy "
                "decoding would return the same sequence each time; use beam "
                "search (`num_beams` >= `num_return_sequences`) or sampling "
                "(`temperature` > 0, `key=`)."
            )
        return None
    if not mode.greedy:
        raise ValueError(
            f"`generate`: beam search (`num_beams`={num}) chooses the most likely "
            "beams; it does not sample. Give `temperature=0`, or `num_beams=1` "
            "to sample."
        )
    if returned > num:
        raise ValueError(
            f"`generate`: `num_return_sequences`={returned} is more than "
            f"`num_beams`={num}; beam search returns at most its beams."
        )
    return Beams(num, early_stopping, float(length_penalty))


def beam_search(
    model: Any, batch: Batch, capacity: int, beams: Beams, rules: Rules
) -> tuple[np.ndarray, np.ndarray]:
    """`(new, scores)`: each prompt's finished beams, best first: their new
    tokens `(batch, num_beams, steps)` (`pad_id` after an end) and scores
    `(batch, num_beams)`. `batch` holds host arrays."""
    steps, vocab_size = int(batch.steps), model.config.vocab_size
    # Enough candidates that `num` of them do not end: `transformers` keeps
    # `(1 + end ids) * num`; one more per end slot, used or not, gives the same
    # beams (the extra candidates rank below those) and keeps the program the
    # same for any number of end ids up to the slots.
    keep = min(max(2, 1 + len(batch.ends)) * beams.num, beams.num * vocab_size)
    new, scores = _beam_loop(
        model, batch, _divisors(beams, steps, capacity),
        np.bool_(beams.early_stopping is True), capacity, beams.num, keep, rules,
    )  # fmt: skip
    return np.asarray(new)[:, :, :steps], np.asarray(scores)


def _divisors(beams: Beams, steps: int, capacity: int) -> np.ndarray:
    """Row 0: a beam finished with `n` new tokens has its score divided by
    `n ** length_penalty` (entry `n - 1`). Row 1: what the early-stopping estimate
    divides the best running score by after `n` tokens (the same, or with
    `"never"` and a positive penalty, the most new tokens). Computed in float64,
    then rounded, as `transformers` computes the power in Python."""
    n = np.arange(1, capacity + 1, dtype=np.float64)
    lengths = n**beams.length_penalty
    hypothetical = lengths
    if beams.early_stopping == "never" and beams.length_penalty > 0:
        hypothetical = np.full(capacity, float(steps) ** beams.length_penalty)
    return np.stack([lengths, hypothetical]).astype(np.float32)


class _Search(NamedTuple):
    """The loop's carry: per prompt, its running beams (tokens, summed
    log-probabilities) and its finished ones (tokens, scores, whether filled)."""

    i: Int[Array, ""]  # new tokens so far
    running: Int[Array, "batch beams slots"]
    running_scores: Float[Array, "batch beams"]
    finished: Int[Array, "batch beams slots"]
    scores: Float[Array, "batch beams"]
    filled: Array  # (batch, beams) bool
    open: Array  # (batch,) bool: a running beam may still beat the finished ones
    going: Array  # () bool
    state: Any


# The ids fed to the model are the prompt (checked before tracing), its padding
# and chosen tokens (indices into the vocabulary): the traced id check is left
# out, as in `decode_loop`.
@ids_known_in_range()
def beam_loop(
    model: Any,
    batch: Batch,
    divisors: Float[Array, "2 capacity"],
    when_full: Array,
    capacity: int,
    num: int,
    keep: int,
    rules: Rules,
) -> tuple[Array, Array]:
    """The finished beams of every prompt, best first: their new tokens
    `(batch, num, capacity)` and scores `(batch, num)`. `num` beams per prompt,
    `keep` candidates per prompt each step; `when_full`: `early_stopping=True`
    (a prompt's search ends once it has `num` finished beams)."""
    start, steps = batch.start, batch.steps
    prompts = batch.padded.shape[0]
    step, state, logits, tokens = prefill(model, batch, capacity, repeat=num)
    lo = tokens.lo.reshape(prompts, num)[:, 0]
    running = tokens.ids.reshape(prompts, num, -1)
    first = jnp.full((prompts, num), NEVER, jnp.float32).at[:, 0].set(0.0)
    search = _Search(
        jnp.int32(0), running, first, running,
        jnp.full((prompts, num), NEVER, jnp.float32),
        jnp.zeros((prompts, num), bool), jnp.ones(prompts, bool), jnp.bool_(True),
        state,
    )  # fmt: skip
    advance = _advance(
        Knobs(*batch.knobs), batch.ends, batch.stops, start, steps, divisors,
        when_full, lo, num, keep, rules,
    )  # fmt: skip
    search = advance(search, logits)

    def more(search: _Search) -> Array:
        return (search.i < steps) & search.going

    def body(search: _Search) -> _Search:
        slot = start + search.i - 1
        last = jax.lax.dynamic_index_in_dim(search.running, slot, 2, keepdims=False)
        logits, state = step(last.reshape(-1, 1), search.state, slot)
        return advance(search._replace(state=state), logits[:, 0])

    search = jax.lax.while_loop(more, body, search)
    new = jax.lax.dynamic_slice_in_dim(search.finished, start, capacity, axis=2)
    return new, search.scores


def _advance(
    knobs: Knobs,
    ends: Array,
    stops: Array | None,
    start: Array,
    steps: Array,
    divisors: Array,
    when_full: Array,
    lo: Array,
    num: int,
    keep: int,
    rules: Rules,
) -> Callable[[_Search, Array], _Search]:
    """One step of the search, from the running beams' next-token logits."""

    def advance(search: _Search, logits: Array) -> _Search:
        batch, _, slots = search.running.shape
        i, pos = search.i, start + search.i
        row_lo = jnp.repeat(lo, num)
        tokens = Tokens(search.running.reshape(batch * num, slots), row_lo, pos)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        logp = apply_rules(logp, tokens, i, knobs.penalty, knobs.min_new, ends, rules)
        vocab = logp.shape[-1]
        total = logp.reshape(batch, num, vocab) + search.running_scores[:, :, None]
        top, index = jax.lax.top_k(total.reshape(batch, num * vocab), keep)
        parent, token = index // vocab, index % vocab
        grown = jnp.take_along_axis(search.running, parent[:, :, None], axis=1)
        grown = jax.lax.dynamic_update_slice(grown, token[:, :, None], (0, 0, pos))
        ended = is_end(token, ends)
        if stops is not None:
            flat = Tokens(
                grown.reshape(batch * keep, slots), jnp.repeat(lo, keep), pos + 1
            )
            ended |= stopped(flat, stops).reshape(batch, keep)
        ended |= i + 1 >= steps
        # the running beams of the next step: the best candidates that did not end
        live = top + ended.astype(jnp.float32) * NEVER
        chosen = jax.lax.top_k(live, num)[1]
        take = lambda x: jnp.take_along_axis(x, chosen, axis=1)  # noqa: E731
        running = jnp.take_along_axis(grown, chosen[:, :, None], axis=1)
        source = (jnp.arange(batch)[:, None] * num + take(parent)).reshape(-1)
        state = jax.tree.map(lambda x: x[source], search.state)
        finished, scores, filled = _finish(
            search, top, grown, ended, divisors[0, i], when_full, num
        )
        # can a running beam still beat the worst finished one?
        best = take(live)[:, 0] / divisors[1, i]
        worst = jnp.where(filled, jnp.min(scores, axis=1, keepdims=True), NEVER)
        open_ = search.open & (best[:, None] > worst).any(axis=1)
        full = filled.all() & when_full
        going = open_.any() & ~full & ~ended.all()
        return _Search(
            i + 1, running, take(live), finished, scores, filled, open_, going, state
        )

    return advance


def _finish(
    search: _Search,
    top: Array,
    grown: Array,
    ended: Array,
    divisor: Array,
    when_full: Array,
    num: int,
) -> tuple[Array, Array, Array]:
    """The finished beams after a step: the best `num` of those so far and the
    candidates among the best `num` that ended now (their scores divided by the
    length penalty), unless the prompt's search is over."""
    now = ended & (jnp.arange(top.shape[1]) < num)[None, :]
    score = top / divisor
    full = search.filled.all(axis=1, keepdims=True) & when_full
    score += full.astype(jnp.float32) * NEVER
    score += (~search.open[:, None]).astype(jnp.float32) * NEVER
    score += (~now).astype(jnp.float32) * NEVER
    scores = jnp.concatenate([search.scores, score], axis=1)
    best = jax.lax.top_k(scores, num)[1]
    take = lambda x: jnp.take_along_axis(x, best, axis=1)  # noqa: E731
    finished = jnp.concatenate([search.finished, grown], axis=1)
    finished = jnp.take_along_axis(finished, best[:, :, None], axis=1)
    filled = take(jnp.concatenate([search.filled, now], axis=1))
    return finished, take(scores), filled


_beam_loop: Callable[..., tuple] = filter_jit(beam_loop)
