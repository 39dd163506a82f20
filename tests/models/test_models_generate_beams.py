"""`boxwood.models.generate(num_beams=...)`: beam search token for token equal to
`transformers`' (sequences and their scores) on a tiny GPT-2 and a tiny Llama,
for a ragged batch with an end token met mid-search, under each
`early_stopping`, several `length_penalty`s and `num_return_sequences`; with
the score rules; and the checks of its arguments. One compiled loop per family
(and one with rules): `length_penalty` and `early_stopping` are data."""

import functools

import numpy as np
import pytest

import boxwood.models as bm
from _hf_models import generation_pair, token_ids, torch
from _precision import highest_matmul_precision  # noqa: F401
from boxwood.models._beam_search import _beam_loop

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

PROMPTS = [token_ids(0, (7,)), token_ids(1, (3,)), token_ids(2, (12,))]
NEW = 12
PAD = 5
BEAMS = 3
# (early_stopping, length_penalty, num_return_sequences). With `_end`'s end
# tokens on GPT-2, the first two return other beams if the search ignores that
# no running beam can improve (`False`) or that a prompt has all its beams
# (`True`), and `"never"` and `False` differ on prompts 0 and 1 at 1.0.
SEARCHES = [
    (False, 1.0, 3),
    (True, 2.0, 3),
    ("never", 1.0, 2),
    (False, 2.0, 2),
    ("never", 0.5, 3),
    (True, -1.0, 1),
]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request):
    return request.param, *generation_pair(request.param)


def _hf(reference, prompts, **options):
    """`transformers`' beam search of `prompts` (left-padded), its sequences
    (each without its left padding) and their scores."""
    longest = max(len(p) for p in prompts)
    ids = np.full((len(prompts), longest), PAD)
    mask = np.zeros((len(prompts), longest), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = prompt
        mask[row, longest - len(prompt) :] = 1
    with torch.no_grad():
        out = reference.generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=NEW,
            do_sample=False, num_beams=BEAMS, pad_token_id=PAD, output_scores=True,
            return_dict_in_generate=True, **options,
        )  # fmt: skip
    return out.sequences.numpy()[:, longest:], out.sequences_scores.numpy()


@functools.cache
def _end(kind):
    """Two end tokens that the beams meet mid-search: the 2nd and 6th new
    tokens of prompt 0's best beam without one (with them, `early_stopping`'s
    `False` and `"never"` give different beams on GPT-2)."""
    _, reference = generation_pair(kind)
    new, _ = _hf(reference, PROMPTS[:1], eos_token_id=None)
    return sorted({int(new[0, 1]), int(new[0, 5])})


def _check(out, scores, prompts, expected, expected_scores, n):
    """Each prompt's `n` rows of `out` (left-padded to the longest prompt) equal
    `transformers`' new tokens (then `PAD`) and scores."""
    longest = max(len(p) for p in prompts)
    out = np.asarray(out)
    assert out.shape == (len(prompts) * n, longest + NEW)
    for row, prompt in enumerate(np.repeat(np.arange(len(prompts)), n)):
        p = prompts[prompt]
        np.testing.assert_array_equal(out[row, longest - len(p) : longest], p)
    width = expected.shape[1]
    np.testing.assert_array_equal(out[:, longest : longest + width], expected)
    np.testing.assert_array_equal(out[:, longest + width :], PAD)
    np.testing.assert_allclose(
        np.asarray(scores), expected_scores, rtol=1e-4, atol=1e-5
    )


def test_beam_search_equals_transformers(pair):
    kind, model, reference = pair
    end = _end(kind)
    ended = 0
    for early_stopping, length_penalty, n in SEARCHES:
        options = dict(
            early_stopping=early_stopping, length_penalty=length_penalty,
            num_return_sequences=n, eos_token_id=end,
        )  # fmt: skip
        out = bm.generate(
            model, PROMPTS, NEW, num_beams=BEAMS, pad_token_id=PAD,
            output_scores=True, **options,
        )  # fmt: skip
        assert out.scores is None and out.log_probs is None
        expected, expected_scores = [], []
        for prompt in PROMPTS:  # transformers on each prompt alone
            new, scores = _hf(reference, [prompt], **options)
            expected.append(
                np.pad(new, ((0, 0), (0, NEW - new.shape[1])), constant_values=PAD)
            )
            expected_scores.append(scores)
        expected = np.concatenate(expected)
        _check(
            out.sequences,
            out.sequence_scores,
            PROMPTS,
            expected,
            np.concatenate(expected_scores),
            n,
        )
        ended += int(
            (np.isin(expected[:, :-1], end) & (expected[:, 1:] == PAD))
            .any(axis=1)
            .sum()
        )
        # transformers' own batch (left-padded) gives the same
        new, scores = _hf(reference, PROMPTS, **options)
        _check(out.sequences, out.sequence_scores, PROMPTS, new, scores, n)
    # a right-padded batch with its `attention_mask`: the same search
    ids = np.full((3, 14), PAD)
    mask = np.zeros((3, 14), np.int32)
    for row, prompt in enumerate(PROMPTS):
        ids[row, : len(prompt)], mask[row, : len(prompt)] = prompt, 1
    masked = bm.generate(
        model, ids, NEW, attention_mask=mask, num_beams=BEAMS, pad_token_id=PAD,
        output_scores=True, **options,
    )  # fmt: skip
    for field in ("sequences", "sequence_scores"):
        np.testing.assert_array_equal(
            np.asarray(getattr(masked, field)), np.asarray(getattr(out, field))
        )
    assert ended >= 2  # beams that ended on the end token before the last step
    # one end id fewer: the same compiled search, still `transformers`' beams
    assert len(end) == 2
    traces = _beam_loop.cache_info().traces
    options["eos_token_id"] = end[:1]
    out = bm.generate(
        model, PROMPTS, NEW, num_beams=BEAMS, pad_token_id=PAD,
        output_scores=True, **options,
    )  # fmt: skip
    assert _beam_loop.cache_info().traces == traces
    new, scores = _hf(reference, PROMPTS, **options)
    _check(
        out.sequences,
        out.sequence_scores,
        PROMPTS,
        new,
        scores,
        options["num_return_sequences"],
    )


def test_one_prompt_with_rules():
    """The rules act after the logits: one family (GPT-2) checks them."""
    model, reference = generation_pair("gpt2")
    options = dict(
        repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=4,
        eos_token_id=_end("gpt2"), num_return_sequences=2, length_penalty=0.7,
    )  # fmt: skip
    out = bm.generate(
        model, PROMPTS[0], NEW, num_beams=BEAMS, pad_token_id=PAD, **options
    )
    new, _ = _hf(reference, PROMPTS[:1], **options)
    _check(out, np.zeros(2), PROMPTS[:1], new, np.zeros(2), 2)
    plain = {
        k: options[k]
        for k in ("eos_token_id", "num_return_sequences", "length_penalty")
    }
    without = _hf(reference, PROMPTS[:1], **plain)[0]  # the rules change the beams
    assert without.shape != new.shape or (without != new).any()
    # one sequence: the shape of one prompt
    one = bm.generate(
        model, PROMPTS[0], NEW, num_beams=BEAMS, pad_token_id=PAD,
        **{**options, "num_return_sequences": 1},
    )  # fmt: skip
    assert one.shape == (7 + NEW,)
    np.testing.assert_array_equal(np.asarray(one), np.asarray(out)[0])


def test_beam_argument_errors(pair):
    _, model, _ = pair
    ids = PROMPTS[0]
    with pytest.raises(
        ValueError, match=r"`num_return_sequences`=4 is more than `num_beams`=3"
    ):
        bm.generate(model, ids, 3, num_beams=3, num_return_sequences=4)
    with pytest.raises(ValueError, match="`num_beams` must be at least 1, got 0"):
        bm.generate(model, ids, 3, num_beams=0)
    with pytest.raises(TypeError, match="`num_beams` must be an int, got 2.0"):
        bm.generate(model, ids, 3, num_beams=2.0)
    with pytest.raises(
        ValueError, match=r"beam search \(`num_beams`=2\) chooses the most"
    ):
        bm.generate(model, ids, 3, num_beams=2, temperature=1.0, key=np.zeros(2))
    for bad in ("always", 1, None):
        with pytest.raises(
            ValueError, match="`early_stopping` must be `True`, `False`"
        ):
            bm.generate(model, ids, 3, num_beams=2, early_stopping=bad)
    with pytest.raises(TypeError, match="`length_penalty` must be a finite number"):
        bm.generate(model, ids, 3, num_beams=2, length_penalty=float("inf"))
    with pytest.raises(ValueError, match="`callback` streams the tokens"):
        bm.generate(model, ids, 3, num_beams=2, callback=print)
