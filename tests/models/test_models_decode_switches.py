"""`generate`'s decoding-step switches: one new token attended with plain
products (`_attend.DECODE_ATTENTION`), the loop's cache with heads side by side
(`_blocks.GROUP_HEADS`: `GroupedCache`) and the layers sliced apart before the
loop over several rows (`_generate_loop.ROWS_APART`) give today's tokens and
scores, and the public `init_cache` keeps its layout."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _precision import on_cpu
from _tiny_causal_lms import gpt2, llama, mistral
from boxwood.models import (
    _attend,
    _beam_search,
    _blocks,
    _decode_layers,
    _generate,
    _generate_loop,
)
from boxwood.models._attend import Step, attend
from boxwood.models._blocks import GroupedCache, write_cache

# (DECODE_ATTENTION, GROUP_HEADS, ROWS_APART)
TODAY = ("fused", "never", 1)
SWITCHED = {
    "einsum": ("einsum", "never", 1),
    "all": ("einsum", "always", 64),
}
# (model, prompts, beams): GPT-2, prompts of one length; Llama with
# grouped-query attention, left-padded prompts of several lengths, beam
# search; Mistral with a sliding window (3) over one prompt (no `vmap`)
CASES = (
    (gpt2, np.array([[3, 5, 7], [11, 13, 17]]), 1),
    (llama, [[3, 5], [7, 9, 11, 13]], 2),
    (mistral, np.array([3, 5, 7, 9]), 1),
)


def _switched(monkeypatch, switches):
    attention, group, apart = switches
    monkeypatch.setattr(_attend, "DECODE_ATTENTION", attention)
    monkeypatch.setattr(_blocks, "GROUP_HEADS", group)
    monkeypatch.setattr(_generate_loop, "ROWS_APART", apart)
    monkeypatch.setattr(_decode_layers, "SLICE_LAYERS", "always")
    _generate._decode.clear_cache()
    _beam_search._beam_loop.clear_cache()


def _paths_taken(monkeypatch):
    """Counts the traces of the two one-token attentions."""
    taken = {"_one_token": 0, "_one_token_grouped": 0}
    for name in taken:
        original = getattr(_attend, name)

        def spy(*args, name=name, original=original):
            taken[name] += 1
            return original(*args)

        monkeypatch.setattr(_attend, name, spy)
    return taken


def _outputs(monkeypatch, switches):
    _switched(monkeypatch, switches)
    out = []
    for make, prompts, beams in CASES:
        result = bm.generate(make(), prompts, 5, num_beams=beams, output_scores=True)
        scores = result.scores if beams == 1 else result.sequence_scores
        out.append((np.asarray(result.sequences), np.asarray(scores)))
    return out


@pytest.fixture(scope="module")
def today():
    # Off the CPU each test runs at `highest` precision (tests/conftest.py), but
    # a module's fixture is set up outside that: the reference is made so too.
    highest = jax.default_matmul_precision("highest")
    with pytest.MonkeyPatch.context() as monkeypatch:
        with contextlib.nullcontext() if on_cpu() else highest:
            outputs = _outputs(monkeypatch, TODAY)
        yield outputs
        _switched(monkeypatch, TODAY)  # the loops compiled anew after the test
    _generate._decode.clear_cache()
    _beam_search._beam_loop.clear_cache()


@pytest.mark.parametrize("name", list(SWITCHED))
def test_switches_give_todays_tokens_and_scores(monkeypatch, today, name):
    taken = _paths_taken(monkeypatch)
    switched = _outputs(monkeypatch, SWITCHED[name])
    grouped = SWITCHED[name][1] == "always"
    assert (taken["_one_token_grouped"] > 0) == grouped
    assert (taken["_one_token"] > 0) == (not grouped)
    for (tokens, scores), (want_tokens, want_scores) in zip(switched, today):
        np.testing.assert_array_equal(tokens, want_tokens)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    _generate._decode.clear_cache()
    _beam_search._beam_loop.clear_cache()


@functools.cache
def _queries_keys_values(dim):
    """A prompt of 5 tokens, then one more: 8 query heads over 4 key/value heads
    of `dim` (drawn once per `dim`, outside the compiled attention)."""
    keys = jax.random.split(jax.random.key(0), 6)
    shapes = [(n, h, dim) for n in (5, 1) for h in (8, 4, 4)]
    return tuple(jax.random.normal(k, shape) for k, shape in zip(keys, shapes))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _one_step_attention(attention, group, window, padded, data, pad):
    """`data`'s prompt, then its new token, attended over a cache of 8 slots held
    as `group` says: the prompt's attention output and the new token's. One
    program per switch setting (the switches are read while tracing, so they are
    static here; the callers set the module's switches to the same values)."""
    assert (_attend.DECODE_ATTENTION, _blocks.GROUP_HEADS) == (attention, group)
    q1, k1, v1, q2, k2, v2 = data
    dim = q1.shape[-1]
    zeros = jnp.zeros((2, 8, 4, dim))
    cache = (zeros, zeros)
    if group != "never":
        g = _blocks.group_size(4, dim)
        empty = jnp.zeros((2, 4 // g, 8, g * dim))
        cache = GroupedCache(empty, empty)
    pad = pad if padded else None
    k, v, cache = write_cache(cache, 1, k1, v1, 0)
    first = attend(q1, k, v, Step(0, pad, True), window)
    k, v, cache = write_cache(cache, 1, k2, v2, 5)
    return first, attend(q2, k, v, Step(5, pad, True), window)


def _attention_with(monkeypatch, attention, group, window, pad, dim):
    monkeypatch.setattr(_attend, "DECODE_ATTENTION", attention)
    monkeypatch.setattr(_blocks, "GROUP_HEADS", group)
    padded = pad is not None
    pad = jnp.int32(0 if pad is None else pad)
    data = _queries_keys_values(dim)
    return _one_step_attention(attention, group, window, padded, data, pad)


# heads of 16: all 4 in one row; of 64: two rows of 2 (as GPT-2-small's)
@pytest.mark.parametrize(
    "window, pad, dim", [(None, None, 16), (3, None, 16), (None, 2, 16), (3, 2, 64)]
)
def test_one_token_attention_matches_the_fused_call(monkeypatch, window, pad, dim):
    want = _attention_with(monkeypatch, "fused", "never", window, pad, dim)
    for group in ("never", "always"):
        got = _attention_with(monkeypatch, "einsum", group, window, pad, dim)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_the_grouped_cache_has_its_layout_and_init_cache_keeps_its_own(
    monkeypatch,
):
    model, length = llama(), 10  # 2 key/value heads of 8, 2 layers
    plain = model.init_cache(length)
    (keys, values) = plain.get(model.model.cache)
    assert type(keys) is not GroupedCache
    assert keys.shape == values.shape == (2, length, 2, 8)
    monkeypatch.setattr(_blocks, "GROUP_HEADS", "always")
    state = _blocks.grouped_cache(model, model.init_cache(length))
    cache = state.get(model.model.cache)
    assert isinstance(cache, GroupedCache)
    assert cache.keys.shape == cache.values.shape == (2, 1, length, 16)
    state = _blocks.grouped_cache(gpt2(), gpt2().init_cache(length))
    assert state.get(gpt2().transformer.cache).keys.shape == (2, 1, length, 32)
    monkeypatch.setattr(_blocks, "GROUP_HEADS", "never")
    cache = _blocks.grouped_cache(model, model.init_cache(length))
    assert not isinstance(cache.get(model.model.cache), GroupedCache)


@pytest.mark.parametrize(
    "mode, backend, rows, kv_heads, head_dim, size",
    [
        ("auto", "cpu", 32, 12, 64, 1),
        ("auto", "tpu", 32, 12, 64, 2),  # GPT-2-small: two heads to a 128-lane row
        ("auto", "tpu", 1, 12, 64, 1),  # one row: no faster grouped
        ("auto", "tpu", 32, 8, 128, 1),
        ("auto", "tpu", 32, 4, 8, 1),  # 4 heads of 8 fill a quarter of a row
        ("auto", "tpu", 32, 32, 8, 16),
        ("always", "cpu", 1, 4, 8, 4),
        ("always", "cpu", 32, 3, 64, 1),
        ("always", "cpu", 32, 6, 32, 3),
        ("never", "tpu", 32, 12, 64, 1),
    ],
)
def test_group_size(monkeypatch, mode, backend, rows, kv_heads, head_dim, size):
    monkeypatch.setattr(_blocks, "GROUP_HEADS", mode)
    monkeypatch.setattr(_blocks.jax, "default_backend", lambda: backend)
    assert _blocks.group_size(kv_heads, head_dim, rows) == size


def test_auto_keeps_the_attention_a_model_names(monkeypatch):
    # On a TPU, "auto" decodes with plain products and a grouped cache only
    # where the attention is boxwood's to choose: a model that names XLA's or
    # cuDNN's attention keeps it for its decoding steps too.
    monkeypatch.setattr(_attend, "DECODE_ATTENTION", "auto")
    monkeypatch.setattr(_blocks, "GROUP_HEADS", "auto")
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    config = bm.GPT2Config(
        vocab_size=97, n_positions=16, n_embd=256, n_layer=1, n_head=4
    )
    model = bm.GPT2LMHeadModel(config, key=jax.random.key(0))  # heads of 64
    for implementation, chosen in [
        (None, True),
        ("splash", True),  # splash takes no decoding step
        ("xla", False),
        ("cudnn", False),
    ]:
        assert _attend._einsum_decode(implementation) is chosen
        assert (_blocks.group_size(12, 64, 32, implementation) == 2) is chosen
        named = model.with_attention_implementation(implementation)
        state = _blocks.grouped_cache(named, named.init_cache(8), rows=32)
        cache = state.get(named.transformer.cache)
        assert isinstance(cache, GroupedCache) is chosen, implementation
