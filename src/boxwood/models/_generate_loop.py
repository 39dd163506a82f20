"""`generate`'s compiled loop: prefill, then one cached step per new token in a
`lax.while_loop` that ends after `steps` tokens or once every row has emitted an
end token; and the host side of its streaming callback."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jaxtyping import Array, Int

from ._id_ranges import ids_known_in_range
from ._sampling import Sampling, pick

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


def _stepper(model: Any, pads: Array | None, rows: int, cache: Any) -> tuple:
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


def _ended(tokens: Array, ends: Array) -> Array:
    return (tokens[:, None] == ends[None, :]).any(axis=-1)


# The ids the loop feeds the model are the prompt, checked before tracing, its
# padding (`pad_id`, checked) and sampled tokens (argmax or draws over the
# vocabulary): the model's traced id check, a host callback that would keep the
# program out of JAX's persistent compilation cache, is left out.
@ids_known_in_range()
def decode_loop(
    model: Any,
    padded: Int[Array, "batch width"],
    pads: Int[Array, " batch"] | None,
    start: Array,
    steps: Array,
    key: Array,
    knobs: Array,
    ends: Array,
    pad_id: Array,
    stream: Array,
    capacity: int,
    mode: Sampling,
    streaming: bool,
) -> Int[Array, "batch capacity"]:
    """The new tokens, `(batch, capacity)`: `steps` of them per row, then
    `pad_id`. `start` is the slot of the first new token; `knobs` holds
    `(temperature, top_p)`; `ends` the end-token ids (maybe none)."""
    rows, width = padded.shape
    cache = model.init_cache(width + capacity)
    step, state = _stepper(model, pads, rows, cache)
    logits, state = step(padded, state, 0, start)
    keys = jax.random.split(key, capacity)

    def choose(logits: Array, i: Array, done: Array) -> tuple[Array, Array]:
        token = pick(logits, keys[i], knobs[0], knobs[1], mode)
        token = jnp.where(done, pad_id, token)
        return token, done | _ended(token, ends)

    first, done = choose(
        jax.lax.dynamic_index_in_dim(logits, start - 1, 1, keepdims=False),
        jnp.int32(0),
        jnp.zeros(rows, bool),
    )
    out = jnp.full((rows, capacity), pad_id, jnp.int32).at[:, 0].set(first)
    stop = _emit(stream, first, streaming)

    def more(carry: tuple) -> Array:
        i, _, done, stop, _, _ = carry
        return (i < steps) & ~jnp.all(done) & ~stop

    def body(carry: tuple) -> tuple:
        i, token, done, _, out, state = carry
        logits, state = step(token[:, None], state, start + i - 1)
        token, done = choose(logits[:, 0], i, done)
        stop = _emit(stream, token, streaming)
        out = jax.lax.dynamic_update_index_in_dim(out, token, i, 1)
        return i + 1, token, done, stop, out, state

    carry = (jnp.int32(1), first, done, stop, out, state)
    return jax.lax.while_loop(more, body, carry)[4]
