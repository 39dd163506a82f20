"""`boxwood.models.generate` on batches (rows equal to `transformers`' greedy
`generate` of each prompt alone), end tokens, nucleus sampling, new-token
buckets, the streaming callback, and the checks of these arguments. (A ragged
batch streamed from a tensor-parallel model: `test_models_sharding.py`'s
8-device subprocess.)"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _hf_models import generation_pair, token_ids, torch
from _precision import highest_matmul_precision  # noqa: F401
from boxwood.models._generate import _decode
from boxwood.models._sampling import Sampling, default_pad_id, pick

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

# Lengths in one bucket (16) and across two (17 -> 32).
RAGGED = [(0, 7), (1, 3), (2, 12), (3, 16)]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request):
    return generation_pair(request.param)


@pytest.fixture(scope="module")
def gpt2_pair():
    """For the tests of what `generate` does after the model's logits (sampling,
    end tokens, callbacks, the check of `decode`'s signature): that code is the
    same for every family, whose batched, left-padded decoding the tests on
    `pair` check against `transformers`."""
    return generation_pair("gpt2")


def _hf(reference, ids, n, eos=None, pad=0):
    with torch.no_grad():
        out = reference.generate(
            torch.tensor(ids)[None], max_new_tokens=n, do_sample=False,
            eos_token_id=eos, pad_token_id=pad,
        )  # fmt: skip
    return out[0].numpy()


def _default_pad(model):
    """The config's `pad_token_id`, else its `eos_token_id` (GPT-2's has no pad)."""
    c = model.config
    return c.eos_token_id if c.pad_token_id is None else c.pad_token_id


def _prompts(cases):
    return [token_ids(seed, (length,)) for seed, length in cases]


@pytest.mark.parametrize("cases", [RAGGED, [(4, 17), (5, 2)]])
def test_batch_rows_equal_transformers_and_one_prompt(pair, cases):
    model, reference = pair
    prompts = _prompts(cases)
    longest = max(len(p) for p in prompts)
    # arrays and lists of ints mix
    out = bm.generate(model, [prompts[0].tolist(), *prompts[1:]], 16)
    assert out.shape == (len(prompts), longest + 16) and out.dtype == jnp.int32
    pad = _default_pad(model)
    for prompt, row in zip(prompts, np.asarray(out)):
        np.testing.assert_array_equal(row[: longest - len(prompt)], pad)
        alone = row[longest - len(prompt) :]
        np.testing.assert_array_equal(alone, _hf(reference, prompt, 16))
        np.testing.assert_array_equal(alone, np.asarray(bm.generate(model, prompt, 16)))


def test_batch_array_of_one_length(pair):
    model, _ = pair
    batch = token_ids(7, (3, 9))
    out = np.asarray(bm.generate(model, jnp.asarray(batch), 12))
    assert out.shape == (3, 21)
    for prompt, row in zip(batch, out):
        np.testing.assert_array_equal(row, np.asarray(bm.generate(model, prompt, 12)))
    # the same rows given as a list take the same path
    np.testing.assert_array_equal(np.asarray(bm.generate(model, list(batch), 12)), out)


def test_pad_token_id_fills_the_left(pair):
    model, _ = pair
    prompts = _prompts(RAGGED)
    out = np.asarray(bm.generate(model, prompts, 4, pad_token_id=5))
    np.testing.assert_array_equal(out[1, :13], 5)
    default = np.asarray(bm.generate(model, prompts, 4))
    np.testing.assert_array_equal(out[:, 16:], default[:, 16:])
    np.testing.assert_array_equal(default[1, :13], _default_pad(model))


def test_end_token_stops_each_row(pair):
    model, reference = pair
    prompts = _prompts(RAGGED)
    free = np.asarray(bm.generate(model, prompts, 16))[:, 16:]
    end = int(free[0, 5])
    out = np.asarray(bm.generate(model, prompts, 16, eos_token_id=end))[:, 16:]
    stopped = 0
    for before, after in zip(free, out):
        hits = np.flatnonzero(before == end)
        cut = hits[0] + 1 if hits.size else 16
        stopped += hits.size > 0
        np.testing.assert_array_equal(after[:cut], before[:cut])
        np.testing.assert_array_equal(after[cut:], _default_pad(model))
    assert stopped >= 1 and out[0, 5] == end
    # one prompt: transformers stops there too (its output is shorter)
    one = np.asarray(
        bm.generate(model, prompts[0], 16, eos_token_id=end, pad_token_id=9)
    )
    expected = _hf(reference, prompts[0], 16, eos=end, pad=9)
    np.testing.assert_array_equal(one[: len(expected)], expected)
    np.testing.assert_array_equal(one[len(expected) :], 9)


def test_several_end_tokens_and_early_exit(gpt2_pair):
    model, _ = gpt2_pair
    prompt = token_ids(0, (7,))
    free = np.asarray(bm.generate(model, prompt, 16))[7:]
    ends = [int(free[3]), int(free[1])]
    seen = []
    out = np.asarray(
        bm.generate(model, prompt, 16, eos_token_id=ends, callback=seen.append)
    )
    stop = min(np.flatnonzero(np.isin(free, ends))) + 1
    assert seen == free[:stop].tolist()  # the loop ended there: no more callbacks
    np.testing.assert_array_equal(out[7 : 7 + stop], free[:stop])
    assert (out[7 + stop :] == _default_pad(model)).all()
    # a NumPy array of ids is accepted as well
    again = bm.generate(model, prompt, 16, eos_token_id=np.asarray(ends))
    np.testing.assert_array_equal(np.asarray(again), out)


def test_new_token_counts_share_a_bucket(pair):
    model, _ = pair
    prompt = jnp.asarray(token_ids(8, (5,)))
    longest = np.asarray(bm.generate(model, prompt, 16))
    traces = _decode.cache_info().traces
    for n in (1, 5, 9, 16):  # one bucket of 16 new tokens
        out = np.asarray(bm.generate(model, prompt, n))
        np.testing.assert_array_equal(out, longest[: 5 + n])
    assert _decode.cache_info().traces == traces


def test_callback_streams_tokens(gpt2_pair):
    model, _ = gpt2_pair
    prompt = token_ids(9, (6,))
    seen = []
    out = np.asarray(bm.generate(model, prompt, 10, callback=seen.append))
    assert seen == out[6:].tolist() and all(type(t) is int for t in seen)
    traces = _decode.cache_info().traces
    other = []
    bm.generate(model, prompt, 10, callback=lambda t: other.append(t))
    assert other == seen and _decode.cache_info().traces == traces
    rows = []
    out = np.asarray(bm.generate(model, _prompts(RAGGED), 10, callback=rows.append))
    assert all(r.shape == (4,) and r.dtype == np.int32 for r in rows)
    np.testing.assert_array_equal(np.stack(rows, axis=1), out[:, 16:])


def test_callback_error_stops_and_is_raised(pair):
    model, _ = pair
    seen = []

    def stop_at_three(token):
        seen.append(token)
        if len(seen) == 3:
            raise KeyError("enough tokens")

    with pytest.raises(KeyError, match="enough tokens"):
        bm.generate(model, token_ids(9, (6,)), 12, callback=stop_at_three)
    assert len(seen) == 3
    # the next call is unaffected
    assert bm.generate(model, token_ids(9, (6,)), 2, callback=seen.append).shape == (8,)


def test_batch_of_one_samples_as_one_prompt(gpt2_pair):
    model, _ = gpt2_pair
    prompt = token_ids(10, (5,))
    # nucleus sampling: the program of `test_top_p`
    args = dict(key=jax.random.key(3), temperature=1.5, top_p=0.9)
    one = bm.generate(model, prompt, 12, **args)
    batch = bm.generate(model, [prompt], 12, **args)
    np.testing.assert_array_equal(np.asarray(batch)[0], np.asarray(one))
    # fewer new tokens in the same bucket: the same draws, cut
    shorter = bm.generate(model, prompt, 7, **args)
    np.testing.assert_array_equal(np.asarray(shorter), np.asarray(one)[:12])


def test_top_p(gpt2_pair):
    model, _ = gpt2_pair
    prompt = jnp.asarray(token_ids(6, (4,)))
    greedy = np.asarray(bm.generate(model, prompt, 16))
    sample = lambda seed, p, t=1.0: np.asarray(  # noqa: E731
        bm.generate(model, prompt, 16, key=jax.random.key(seed), temperature=t, top_p=p)
    )
    # a tiny nucleus is the most likely token alone
    np.testing.assert_array_equal(sample(1, 1e-6, 50.0), greedy)
    np.testing.assert_array_equal(sample(1, 1.0), sample(1, None))
    np.testing.assert_array_equal(sample(4, 0.8), sample(4, 0.8))
    assert (sample(1, 0.9, 50.0) != greedy).any()


def test_nucleus_keeps_the_smallest_set_over_top_p():
    logits = jnp.log(jnp.asarray([[0.05, 0.5, 0.15, 0.3]]))
    mode = Sampling(greedy=False, top_k=None, nucleus=True)
    keys = jax.random.split(jax.random.key(0), 400)
    draw = jax.jit(
        jax.vmap(lambda k, p: pick(logits, k, jnp.float32(1), p, mode)[0], (0, None))
    )
    assert set(np.asarray(draw(keys, jnp.float32(0.45))).tolist()) == {1}
    assert set(np.asarray(draw(keys, jnp.float32(0.7))).tolist()) == {1, 3}
    assert set(np.asarray(draw(keys, jnp.float32(0.81))).tolist()) == {1, 2, 3}
    assert set(np.asarray(draw(keys, jnp.float32(0.96))).tolist()) == {0, 1, 2, 3}


def test_batch_argument_errors(pair):
    model, _ = pair
    ids = token_ids(0, (4,))
    with pytest.raises(ValueError, match=r"prompt 1 of `input_ids` is empty"):
        bm.generate(model, [ids, []], 3)
    with pytest.raises(
        ValueError,
        match=r"`input_ids` must be one prompt `\(seq,\)`.*got shape \(2, 2, 4\)",
    ):
        bm.generate(model, jnp.zeros((2, 2, 4), jnp.int32), 3)
    with pytest.raises(
        ValueError, match=r"`input_ids` must be one prompt.*got shape \(\)"
    ):
        bm.generate(model, jnp.int32(3), 3)
    with pytest.raises(ValueError, match="`input_ids` is an empty list"):
        bm.generate(model, [], 3)
    with pytest.raises(ValueError, match=r"prompt 0 of `input_ids` has shape \(1, 4\)"):
        bm.generate(model, [ids[None], ids], 3)
    with pytest.raises(
        TypeError, match="prompt 1: `input_ids` must be an integer array"
    ):
        bm.generate(model, [ids, [1.5, 2.0]], 3)
    with pytest.raises(
        ValueError,
        match="prompt 1: `input_ids` must hold token ids from 0 to 96.*got 97",
    ):
        bm.generate(model, [ids, [5, 97]], 3)
    with pytest.raises(ValueError, match="17 prompt tokens .* exceed the model's 64"):
        bm.generate(model, [ids, token_ids(1, (17,))], 48)
    with pytest.raises(TypeError, match="`callback` must be a function"):
        bm.generate(model, ids, 3, callback="print")


def test_sampling_token_argument_errors(pair):
    model, _ = pair
    ids = token_ids(0, (4,))
    key = jax.random.key(0)
    for bad in (0, 0.0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"`top_p` must be in \(0, 1\]"):
            bm.generate(model, ids, 3, key=key, temperature=1.0, top_p=bad)
    with pytest.raises(TypeError, match=r"`top_p` must be a number in \(0, 1\]"):
        bm.generate(model, ids, 3, key=key, temperature=1.0, top_p="0.9")
    for bad in (97, -1, [2, 97]):
        with pytest.raises(
            ValueError, match="`eos_token_id` must be a token id from 0 to 96"
        ):
            bm.generate(model, ids, 3, eos_token_id=bad)
    for bad in ("2", True, 2.0):
        with pytest.raises(TypeError, match="`eos_token_id` must be an int token id"):
            bm.generate(model, ids, 3, eos_token_id=bad)
    with pytest.raises(ValueError, match="`eos_token_id` is an empty sequence"):
        bm.generate(model, ids, 3, eos_token_id=[])
    for bad in (97, -3):
        with pytest.raises(
            ValueError, match="`pad_token_id` must be a token id from 0 to 96"
        ):
            bm.generate(model, ids, 3, pad_token_id=bad)
    with pytest.raises(TypeError, match="`pad_token_id` must be an int token id"):
        bm.generate(model, ids, 3, pad_token_id=2.5)


def test_default_pad_id_passes_over_ids_outside_the_vocabulary():
    config = lambda **kw: types.SimpleNamespace(**{"pad_token_id": None, **kw})  # noqa: E731
    assert default_pad_id(config(pad_token_id=7, eos_token_id=2), 97) == 7
    assert default_pad_id(config(eos_token_id=(5, 6)), 97) == 5
    assert default_pad_id(config(pad_token_id=97, eos_token_id=50256), 97) == 0
    assert default_pad_id(config(eos_token_id=None), 97) == 0


def test_ragged_prompts_need_a_decode_with_pad(gpt2_pair):
    model, _ = gpt2_pair

    class NoPad:  # a model whose cached step cannot mask left padding
        config, max_positions, init_cache = model.config, 64, model.init_cache

        def decode(self, input_ids, state, start):
            return model.decode(input_ids, state, start)

    with pytest.raises(TypeError, match=r"NoPad.decode takes no `pad`"):
        bm.generate(NoPad(), [[5, 6], [7]], 3)
    # three rows of one length: the program of `test_batch_array_of_one_length`
    rows = [[5, 6], [7, 8], [9, 10]]
    one_length = bm.generate(NoPad(), rows, 3)
    np.testing.assert_array_equal(
        np.asarray(one_length), np.asarray(bm.generate(model, rows, 3))
    )
