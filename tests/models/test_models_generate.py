"""`boxwood.models.generate`: greedy decoding equal to `transformers`' token for
token, one compile per prompt-length bucket, sampling, and its argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import generation_pair, token_ids, torch
from _precision import highest_matmul_precision  # noqa: F401
from boxwood.models._generate import _decode, bucket

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

# New tokens per call: one bucket (16), the one `test_models_generate_batch.py`
# uses for one prompt, so the two files' greedy loops are one compiled program.
NEW = 16


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request):
    return generation_pair(request.param)


@pytest.fixture(scope="module")
def gpt2_pair():
    """For sampling, which is the same code for every family after the logits
    (each family's greedy decoding is checked on `pair`)."""
    return generation_pair("gpt2")


def _hf_greedy(reference, ids, n):
    with torch.no_grad():
        out = reference.generate(
            torch.tensor(ids)[None], max_new_tokens=n, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    return out[0].numpy()


def test_greedy_equals_transformers(pair):
    model, reference = pair
    for seed, length in [(0, 7), (1, 16), (2, 3)]:
        ids = token_ids(seed, (length,))
        out = bm.generate(model, jnp.asarray(ids), NEW)
        assert out.shape == (length + NEW,) and out.dtype == jnp.int32
        expected = _hf_greedy(reference, ids, NEW)
        np.testing.assert_array_equal(np.asarray(out), expected)
    assert len(set(np.asarray(out)[length:].tolist())) > 3  # not a degenerate repeat


@boxwood.filter_jit
def _full_and_prompt(model, ids, state):
    """The full forward pass of `ids` and the cached one of their first five, in
    one compiled program."""
    return model(ids), model.decode(ids[:5], state, 0)


def test_cache_steps_equal_full_forward(pair):
    model, _ = pair
    ids = jnp.asarray(token_ids(3, (9,)))
    decode = boxwood.filter_jit(type(model).decode)
    full, (head, state) = _full_and_prompt(model, ids, model.init_cache(12))
    rest = []
    for i in range(5, 9):
        logits, state = decode(model, ids[i : i + 1], state, jnp.int32(i))
        rest.append(logits[0])
    stepped = jnp.concatenate([head, jnp.stack(rest)])
    assert np.abs(np.asarray(stepped) - np.asarray(full)).max() <= 1e-4


def test_one_compile_per_bucket(pair):
    model, _ = pair
    bm.generate(model, jnp.asarray(token_ids(4, (5,))), 11)  # warm
    traces = _decode.cache_info().traces
    for length, new in ((1, 16), (9, 3), (16, 11)):  # all in the buckets of 16
        bm.generate(model, jnp.asarray(token_ids(length, (length,))), new)
    assert _decode.cache_info().traces == traces
    assert [bucket(n) for n in (1, 16, 17, 33)] == [16, 16, 32, 64]


def test_sampling(gpt2_pair):
    model, _ = gpt2_pair
    ids = jnp.asarray(token_ids(6, (4,)))
    greedy = bm.generate(model, ids, NEW)  # compiled by the first test already
    sample = lambda seed, t: bm.generate(
        model, ids, NEW, key=jax.random.key(seed), temperature=t, top_k=2
    )
    np.testing.assert_array_equal(
        np.asarray(sample(1, 1.0)), np.asarray(sample(1, 1.0))
    )
    # Hot sampling among the top 2 leaves the greedy path; cold sampling keeps it.
    assert (np.asarray(sample(1, 50.0)) != np.asarray(greedy)).any()
    np.testing.assert_array_equal(np.asarray(sample(2, 1e-4)), np.asarray(greedy))


def test_generate_errors(pair):
    model, _ = pair
    ids = jnp.asarray(token_ids(0, (4,)))
    with pytest.raises(ValueError, match="sampling .* needs `key=`"):
        bm.generate(model, ids, 3, temperature=0.7)
    with pytest.raises(ValueError, match="`max_new_tokens` must be at least 1"):
        bm.generate(model, ids, 0)
    with pytest.raises(TypeError, match="`max_new_tokens` must be an int"):
        bm.generate(model, ids, 2.5)
    with pytest.raises(ValueError, match="exceed the model's 64 positions"):
        bm.generate(model, ids, 61)
    with pytest.raises(TypeError, match="`input_ids` must be an integer array"):
        bm.generate(model, ids.astype(jnp.float32), 3)
    with pytest.raises(
        ValueError, match=r"`input_ids` must be one prompt `\(seq,\)`, a batch"
    ):
        bm.generate(model, ids[None, None], 3)
    # a batch of one (the program of `test_greedy_equals_transformers`)
    assert bm.generate(model, ids[None], NEW).shape == (1, 4 + NEW)
    with pytest.raises(TypeError, match="takes a causal language model"):
        bm.generate(object(), ids, 3)


def test_sampling_argument_errors(pair):
    model, _ = pair
    ids = jnp.asarray(token_ids(0, (4,)))
    key = jax.random.key(0)
    with pytest.raises(
        ValueError,
        match=r"`top_k` = 98 is larger than the vocabulary \(97 tokens\); give at most 97",
    ):
        bm.generate(model, ids, 3, key=key, temperature=1.0, top_k=98)
    with pytest.raises(ValueError, match="`top_k` must be at least 1, got 0"):
        bm.generate(model, ids, 3, key=key, temperature=1.0, top_k=0)
    with pytest.raises(TypeError, match="`top_k` must be an int, got 2.5"):
        bm.generate(model, ids, 3, key=key, temperature=1.0, top_k=2.5)
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(
            ValueError, match="`temperature` must be 0 .* or a positive finite"
        ):
            bm.generate(model, ids, 3, key=key, temperature=bad)
    with pytest.raises(TypeError, match="`temperature` must be a number"):
        bm.generate(model, ids, 3, key=key, temperature="hot")
    with pytest.raises(TypeError, match="`max_new_tokens` must be an int, got True"):
        bm.generate(model, ids, True)
    with pytest.raises(
        ValueError, match="`input_ids` must hold token ids from 0 to 96.*got 97 at"
    ):
        bm.generate(model, jnp.asarray([5, 97]), 3)
    # the largest valid `top_k` filters nothing: the program (and draws) of none
    out = bm.generate(model, ids, 2, key=key, temperature=1.0)
    traces = _decode.cache_info().traces
    everything = bm.generate(model, ids, 2, key=key, temperature=1.0, top_k=97)
    np.testing.assert_array_equal(np.asarray(everything), np.asarray(out))
    assert _decode.cache_info().traces == traces


def test_bucket_is_capped_by_the_position_table():
    config = bm.GPT2Config(
        vocab_size=31, n_positions=24, n_embd=16, n_layer=1, n_head=2
    )
    model = boxwood.nn.inference_mode(bm.GPT2LMHeadModel(config, key=jax.random.key(0)))
    ids = jnp.asarray(token_ids(8, (17,), vocab=31))  # bucket 32 > 24 positions
    out = bm.generate(model, ids, 7)
    # greedy by hand; a causal model's logits at a position do not depend on
    # later tokens, so one compiled forward over all 24 positions serves each step
    forward = boxwood.filter_jit(model)
    expected = np.zeros(24, np.int32)
    expected[:17] = np.asarray(ids)
    for n in range(17, 24):
        expected[n] = int(jnp.argmax(forward(jnp.asarray(expected))[n - 1]))
    np.testing.assert_array_equal(np.asarray(out), expected)
