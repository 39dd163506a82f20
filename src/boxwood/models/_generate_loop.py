"""`generate`'s compiled loop: prefill, then one cached step per new token in a
`lax.while_loop` that ends after `steps` tokens or once every row has emitted an
end token; and the host side of its streaming callback."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jaxtyping import Array

from ..nn import inference_mode
from ._blocks import grouped_cache
from ._causal_lm import CausalLM
from ._decode_layers import with_layers_apart
from ._id_ranges import ids_known_in_range
from ._sampling import Sampling, draw, warp
from ._score_rules import Rules, Tokens, apply_rules, is_end, stopped

# The callbacks of the `generate` calls under way, by the id the compiled loop
# passes back: the program holds no Python function, so every callback shares it.
_STREAMS: dict[int, Stream] = {}
_IDS = itertools.count()


class Stream:
    """A `generate` call's callback, registered for the length of the call. An
    exception from the callback is kept, stops the loop, and is raised on exit."""

    def __init__(self, callback: Callable[[Any], Any] | None, single: bool):
        self.callback = callback
        self.single = single
        self.error: BaseException | None = None
        self.number = next(_IDS) % 2**31
        self.id = np.int32(self.number)  # sent with the call

    def __enter__(self) -> Stream:
        _STREAMS[self.number] = self
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        _STREAMS.pop(self.number, None)
        if kind is None and self.error is not None:
            raise self.error

    def send(self, tokens: np.ndarray) -> bool:
        """Give `tokens` to the callback; True once it has raised (stop)."""
        if self.error is None and self.callback is not None:
            try:
                self.callback(int(tokens[0]) if self.single else tokens)
            except BaseException as error:  # noqa: BLE001 (re-raised by __exit__)
                self.error = error
        return self.error is not None


def _deliver(stream: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return np.asarray(_STREAMS[int(stream)].send(np.asarray(tokens, np.int32)))


def _emit(stream: Array, tokens: Array, streaming: bool) -> Array:
    """Hand `tokens` to the host callback; True when it asks to stop."""
    if not streaming:
        return jnp.bool_(False)
    result = jax.ShapeDtypeStruct((), jnp.bool_)
    return io_callback(_deliver, result, stream, tokens, ordered=True)


# The most rows for which `generate`'s loop takes the layers sliced apart
# before it (`_decode_layers`); over more rows the model is used as it is.
ROWS_APART = 1


def _decoder(model: Any, pads: Any, ids: Array, start: Any, end: Any) -> Any:
    """`model.decode` for a step of `ids` from slot `start` whose last real token
    sits at slot `end - 1` (`None`: the last of `ids`). A model with `dynamic`
    RoPE scaling is given the step's `extent`: the longest row's real positions,
    as in `transformers`' batched `generate`."""
    if not getattr(model, "uses_extent", False):
        return model.decode
    end = start + ids.shape[-1] if end is None else end
    extent = end if pads is None else end - jnp.min(pads)
    return functools.partial(model.decode, extent=extent)


def stepper(model: Any, pads: Array | None, rows: int, cache: Any) -> tuple:
    """`model.decode` over a batch of rows at one `start` (`end`: the slot after
    the step's last real token, by default after its last token), and the rows'
    cache. One row without padding (one prompt) is decoded as is, without
    `jax.vmap`."""
    if pads is None and rows == 1:

        def single(ids: Array, state: Any, start: Any, end: Any = None) -> tuple:
            decode = _decoder(model, pads, ids, start, end)
            logits, state = decode(ids[0], state, start)
            return logits[None], state

        return single, cache
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (rows, *x.shape)), cache)
    if pads is None:

        def same(ids: Array, state: Any, start: Any, end: Any = None) -> tuple:
            decode = _decoder(model, pads, ids, start, end)
            return jax.vmap(decode, in_axes=(0, 0, None))(ids, state, start)

        return same, state

    def step(ids: Array, state: Any, start: Any, end: Any = None) -> tuple:
        decode = _decoder(model, pads, ids, start, end)
        one = lambda i, s, p: decode(i, s, start, pad=p)  # noqa: E731
        return jax.vmap(one)(ids, state, pads)

    return step, state


class Knobs(NamedTuple):
    """The values of a call that are data of the compiled loop (float32 each):
    `temperature`, `top_p`, `repetition_penalty`, `min_new_tokens`."""

    temperature: Any
    top_p: Any
    penalty: Any
    min_new: Any


class Options(NamedTuple):
    """What a call compiles for: the sampling mode, the score rules, whether stop
    sequences are checked, whether scores are returned, whether tokens stream."""

    mode: Sampling
    rules: Rules
    stops: bool
    scores: bool
    streaming: bool


class Batch(NamedTuple):
    """What both compiled loops take as data: the prompts laid out (`padded`;
    each row's left padding `pads`, or `None`; `start`, the slot of the first
    new token), `steps` (the most new tokens), the call's `Knobs`, the end ids
    (`ends`: `end_slots`), the stop sequences (`_score_rules.stop_rows`, or
    `None`) and `pad_id`."""

    # NumPy arrays when `generate` builds it, traced arrays inside the loops
    padded: Any  # int32 (batch, width)
    pads: Any  # int32 (batch,), or None
    start: Any  # int32 ()
    steps: Any  # int32 ()
    knobs: Any  # float32 (4,): `Knobs`
    ends: Any  # int32 (slots,)
    stops: Any  # int32 (sequences, length), or None
    pad_id: Any  # int32 ()


def end_slots(ends: tuple[int, ...]) -> np.ndarray:
    """The end ids in a few slots (4, or the next power of two), the rest -1 (no
    token), so that a call with or without end tokens shares the compiled loop."""
    slots = np.full(max(4, 1 << (len(ends) - 1).bit_length()), -1, np.int32)
    slots[: len(ends)] = ends
    return slots


def prefill(model: Any, batch: Batch, capacity: int, repeat: int = 1) -> tuple:
    """The prompts run once, with room for `capacity` new tokens: `(step, state,
    logits, tokens)`, the rows' stepper and cache, each row's next-token logits,
    and each row's prompt as `Tokens` (the slots past it hold `pad_id` until
    written). Each prompt is `repeat` consecutive rows (beam search's beams).
    The model runs in inference mode (dropout off), switched here, inside the
    trace: `generate` passes the caller's model as it is, so that a call finds
    its flattened form and compiled loop without rebuilding the model. The
    returned stepper is the loop's: for one row, its layers sliced from the
    stack once, here, where `_decode_layers.with_layers_apart` finds that worth
    it (for at most `ROWS_APART` rows without padding). The cache of a `CausalLM` (whose layers write it with
    `_blocks.write_cache`) is a `_blocks.GroupedCache` (heads side by side in 128-lane
    rows) where `_blocks.group_size` says so."""
    model = inference_mode(model, True)
    padded, pads, start = batch.padded, batch.pads, batch.start
    if repeat > 1:
        padded = jnp.repeat(padded, repeat, axis=0)
        pads = None if pads is None else jnp.repeat(pads, repeat)
    rows, width = padded.shape
    cache = model.init_cache(width + capacity)
    if isinstance(model, CausalLM):  # its layers write and read a grouped cache
        cache = grouped_cache(model, cache, rows)
    step, state = stepper(model, pads, rows, cache)
    logits, state = step(padded, state, 0, start)
    if rows <= ROWS_APART and pads is None:  # the loop's layers sliced once
        apart = with_layers_apart(model)
        if apart is not model:
            step = stepper(apart, pads, rows, None)[0]
    logits = jax.lax.dynamic_index_in_dim(logits, start - 1, 1, keepdims=False)
    fill = jnp.full((rows, capacity), batch.pad_id, jnp.int32)
    ids = jnp.concatenate([padded, fill], axis=1)
    lo = jnp.zeros(rows, jnp.int32) if pads is None else pads
    return step, state, logits, Tokens(ids, lo, jnp.asarray(start, jnp.int32))


def _chooser(
    knob: Knobs,
    keys: Array,
    ends: Array,
    stops: Array | None,
    pad_id: Array,
    options: Options,
) -> Callable[..., tuple]:
    """`choose(logits, i, done, tokens)`: the `i`-th new token of every row from
    its logits (`pad_id` where the row is `done`), as `(token, done, tokens,
    scores, log_prob)`: the rows that have stopped now, the rows' tokens with
    it, the scores it was drawn from and its log-probability under them."""
    mode, rules = options.mode, options.rules
    # only these read the rows' tokens: otherwise they are left unwritten
    reads = rules.penalty or rules.ngram > 0 or stops is not None

    def choose(logits: Array, i: Array, done: Array, tokens: Tokens) -> tuple:
        scores = logits.astype(jnp.float32)
        scores = apply_rules(scores, tokens, i, knob.penalty, knob.min_new, ends, rules)
        scores = warp(scores, knob.temperature, knob.top_p, mode)
        token = jnp.where(done, pad_id, draw(scores, keys[i], mode))
        tokens = tokens.written(token) if reads else tokens
        ended = is_end(token, ends)
        if stops is not None:
            ended |= stopped(tokens, stops)
        logp = jnp.take_along_axis(
            jax.nn.log_softmax(scores, axis=-1), token[:, None], axis=-1
        )[:, 0]
        return token, done | ended, tokens, scores, jnp.where(done, 0.0, logp)

    return choose


def _score_buffers(scores: Array, capacity: int) -> tuple[Array, Array]:
    """Room for each step's scores and each new token's log-probability."""
    rows, vocab = scores.shape
    return (
        jnp.zeros((rows, capacity, vocab), jnp.float32),
        jnp.zeros((rows, capacity), jnp.float32),
    )


def _record(kept: tuple, i: Array, scores: Array, logp: Array) -> tuple:
    """`kept` (the score buffers, or `()`) with step `i`'s entries."""
    if not kept:
        return kept
    return (
        jax.lax.dynamic_update_index_in_dim(kept[0], scores, i, 1),
        jax.lax.dynamic_update_index_in_dim(kept[1], logp, i, 1),
    )


# The ids the loop feeds the model are the prompt, checked before tracing, its
# padding (`pad_id`, checked) and sampled tokens (argmax or draws over the
# vocabulary): the model's traced id check, a host callback that would keep the
# program out of JAX's persistent compilation cache, is left out.
@ids_known_in_range()
def decode_loop(
    model: Any,
    batch: Batch,
    key: Array,
    stream: Array,
    capacity: int,
    options: Options,
) -> tuple:
    """`(new, steps_run, scores, log_probs)`: the new tokens, `(batch,
    capacity)`, `batch.steps` of them per row, then `pad_id`; the number of
    steps run; with `options.scores`, each step's scores `(batch, capacity,
    vocab)` (as `transformers` returns them: after the rules and the sampling
    warpers) and each new token's log-probability under them `(batch,
    capacity)` (0 after a row has stopped), else `None`."""
    start, steps, pad_id = batch.start, batch.steps, batch.pad_id
    step, state, logits, tokens = prefill(model, batch, capacity)
    rows = logits.shape[0]
    keys = jax.random.split(key, capacity)
    choose = _chooser(
        Knobs(*batch.knobs), keys, batch.ends, batch.stops, pad_id, options
    )
    first, done, tokens, scores, logp = choose(
        logits, jnp.int32(0), jnp.zeros(rows, bool), tokens
    )
    kept = () if not options.scores else _score_buffers(scores, capacity)
    kept = _record(kept, jnp.int32(0), scores, logp)
    out = jnp.full((rows, capacity), pad_id, jnp.int32).at[:, 0].set(first)
    stop = _emit(stream, first, options.streaming)

    def more(carry: tuple) -> Array:
        i, _, done, stop = carry[:4]
        return (i < steps) & ~jnp.all(done) & ~stop

    def body(carry: tuple) -> tuple:
        i, token, done, _, out, state, tokens, kept = carry
        logits, state = step(token[:, None], state, start + i - 1)
        token, done, tokens, scores, logp = choose(logits[:, 0], i, done, tokens)
        stop = _emit(stream, token, options.streaming)
        out = jax.lax.dynamic_update_index_in_dim(out, token, i, 1)
        kept = _record(kept, i, scores, logp)
        return i + 1, token, done, stop, out, state, tokens, kept

    carry = (jnp.int32(1), first, done, stop, out, state, tokens, kept)
    i, _, _, _, out, _, _, kept = jax.lax.while_loop(more, body, carry)
    return (out, i, *kept) if options.scores else (out, i, None, None)
