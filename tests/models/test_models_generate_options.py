"""`boxwood.models.generate`'s options from `transformers`' `generate`:
`repetition_penalty`, `no_repeat_ngram_size`, `min_new_tokens`, `stop_sequences`
and `output_scores`, on a ragged batch (each row equal to `transformers` on its
prompt alone: tokens, scores and log-probabilities), sampling checked through its
processed distribution, and the checks of these arguments. Two compiled loops
(greedy and sampled), shared by the tests of this file."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _hf_models import generation_pair, token_ids, torch, transformers
from _precision import highest_matmul_precision  # noqa: F401
from boxwood.models._generate import _decode
from boxwood.models._score_rules import Rules, Tokens, apply_rules

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

PROMPTS = [token_ids(0, (7,)), token_ids(1, (3,)), token_ids(2, (12,))]
NEW = 16
PAD = 5
RULES = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=5)


class EndsWith(transformers.StoppingCriteria):
    """`transformers`' stopping criterion for token sequences: a row stops once
    its tokens end with one of them (the reference for `stop_sequences`)."""

    def __init__(self, sequences):
        self.sequences = sequences

    def __call__(self, input_ids, scores, **kwargs):
        rows = [r.tolist() for r in input_ids]
        return torch.tensor(
            [any(r[len(r) - len(s) :] == s for s in self.sequences) for r in rows]
        )


@pytest.fixture(scope="module")
def gpt2():
    return generation_pair("gpt2")


def _hf(reference, prompt, **options):
    """`transformers`' greedy `generate` of one prompt: its tokens, and with
    `output_scores` its scores and log-probabilities."""
    with torch.no_grad():
        out = reference.generate(
            torch.tensor(prompt)[None], max_new_tokens=NEW, do_sample=False,
            pad_token_id=PAD, output_scores=True, return_dict_in_generate=True,
            **options,
        )  # fmt: skip
        log_probs = reference.compute_transition_scores(
            out.sequences, out.scores, normalize_logits=True
        )
    scores = torch.stack(out.scores, dim=1)[0].numpy()
    return out.sequences[0].numpy(), scores, log_probs[0].numpy()


@functools.cache
def _greedy_case():
    """The options of the greedy test, each chosen where it changes the result:
    the end token is the third new token of prompt 0 without `min_new_tokens`; a
    stop sequence is the 7th and 8th new tokens of prompt 1, another straddles
    prompt 2 and its first new token."""
    _, reference = generation_pair("gpt2")
    rules = {k: v for k, v in RULES.items() if k != "min_new_tokens"}
    free0 = _hf(reference, PROMPTS[0], eos_token_id=None, **rules)[0][7:]
    end = int(free0[2])
    free1 = _hf(reference, PROMPTS[1], eos_token_id=end, **RULES)[0][3:]
    free2 = _hf(reference, PROMPTS[2], eos_token_id=end, **RULES)[0][12:]
    stops = [free1[6:8].tolist(), [int(PROMPTS[2][-1]), int(free2[0])]]
    return end, stops


def test_rules_stop_sequences_and_scores_equal_transformers(gpt2):
    model, reference = gpt2
    end, stops = _greedy_case()
    out = bm.generate(
        model, PROMPTS, NEW, eos_token_id=end, pad_token_id=PAD,
        stop_sequences=stops, output_scores=True, **RULES,
    )  # fmt: skip
    assert isinstance(out, bm.GenerateOutput)
    tokens, scores, log_probs = (np.asarray(x) for x in out[:3])
    assert out.sequence_scores is None
    assert tokens.shape == (3, 12 + NEW) and log_probs.shape == (3, NEW)
    assert scores.shape[0] == 3 and scores.shape[2] == model.config.vocab_size
    criteria = transformers.StoppingCriteriaList([EndsWith(stops)])
    lengths = []
    for prompt, row, row_scores, row_log_probs in zip(
        PROMPTS, tokens, scores, log_probs
    ):
        expected, hf_scores, hf_log_probs = _hf(
            reference, prompt, eos_token_id=end, stopping_criteria=criteria, **RULES
        )
        alone = row[12 - len(prompt) :]
        n = len(expected) - len(prompt)  # the new tokens before the row stopped
        lengths.append(n)
        np.testing.assert_array_equal(alone[: len(expected)], expected)
        np.testing.assert_array_equal(alone[len(expected) :], PAD)
        np.testing.assert_allclose(row_scores[:n], hf_scores, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(row_log_probs[:n], hf_log_probs, atol=1e-4)
        np.testing.assert_array_equal(row_log_probs[n:], 0.0)
    # the loop ran until the last row stopped, and each stop happened where meant
    assert scores.shape[1] == max(lengths)
    assert lengths[0] > 3 and tokens[0, 12 + lengths[0] - 1] == end  # not before 5
    assert lengths[1] == 8 and lengths[2] == 1


def test_each_rule_changes_the_result(gpt2):
    """Each option of the test above is active there: `transformers` without it
    gives other tokens."""
    _, reference = gpt2
    end, _ = _greedy_case()
    rows = lambda **kw: [_hf(reference, p, eos_token_id=end, **kw)[0] for p in PROMPTS]  # noqa: E731
    full = rows(**RULES)
    for name in RULES:
        fewer = {k: v for k, v in RULES.items() if k != name}
        assert any(
            len(a) != len(b) or (a != b).any() for a, b in zip(full, rows(**fewer))
        ), name


def test_rule_values_are_data(gpt2):
    """Other values of the options reuse the compiled loop and still equal
    `transformers`."""
    model, reference = gpt2
    end, stops = _greedy_case()
    other = dict(repetition_penalty=0.7, no_repeat_ngram_size=2, min_new_tokens=9)
    bm.generate(
        model, PROMPTS, NEW, eos_token_id=end, pad_token_id=PAD,
        stop_sequences=stops, output_scores=True, **RULES,
    )  # fmt: skip
    traces = _decode.cache_info().traces
    out = bm.generate(
        model, PROMPTS, NEW, eos_token_id=end, pad_token_id=PAD,
        stop_sequences=stops[:1], output_scores=True, **other,
    )  # fmt: skip
    # a right-padded batch with its `attention_mask` is the list of its prompts
    ids = np.full((3, 14), PAD)
    mask = np.zeros((3, 14), np.int32)
    for row, prompt in enumerate(PROMPTS):
        ids[row, : len(prompt)], mask[row, : len(prompt)] = prompt, 1
    masked = bm.generate(
        model, ids, NEW, attention_mask=mask, eos_token_id=end, pad_token_id=PAD,
        stop_sequences=stops[:1], output_scores=True, **other,
    )  # fmt: skip
    assert _decode.cache_info().traces == traces
    for a, b in zip(masked, out):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    criteria = transformers.StoppingCriteriaList([EndsWith(stops[:1])])
    for prompt, row in zip(PROMPTS, np.asarray(out.sequences)):
        expected = _hf(
            reference, prompt, eos_token_id=end, stopping_criteria=criteria, **other
        )[0]
        alone = row[12 - len(prompt) :]
        np.testing.assert_array_equal(alone[: len(expected)], expected)
        np.testing.assert_array_equal(alone[len(expected) :], PAD)


def _processors(prompt_length, end):
    """`transformers`' processors for the sampled test, in its order."""
    p = transformers.generation.logits_process
    return transformers.LogitsProcessorList([
        p.RepetitionPenaltyLogitsProcessor(RULES["repetition_penalty"]),
        p.NoRepeatNGramLogitsProcessor(RULES["no_repeat_ngram_size"]),
        p.MinNewTokensLengthLogitsProcessor(
            prompt_length, RULES["min_new_tokens"], torch.tensor([end])
        ),
        p.TemperatureLogitsWarper(0.7),
        p.TopKLogitsWarper(20),
        p.TopPLogitsWarper(0.9),
    ])  # fmt: skip


def test_sampled_scores_are_transformers_processed_distribution(gpt2):
    """Sampling with every rule: at each step, the scores the token was drawn
    from equal `transformers`' processors and warpers applied to its model's
    logits of that row's tokens so far; the drawn token is inside them."""
    model, reference = gpt2
    end, _ = _greedy_case()
    prompts = PROMPTS[:2]
    out = bm.generate(
        model, prompts, NEW, key=jax.random.key(1), temperature=0.7, top_k=20,
        top_p=0.9, eos_token_id=end, pad_token_id=PAD, num_return_sequences=2,
        output_scores=True, **RULES,
    )  # fmt: skip
    tokens, scores, log_probs = (np.asarray(x) for x in out[:3])
    assert tokens.shape == (4, 7 + NEW)
    assert (tokens[0, 7:] != tokens[1, 7:]).any()  # two draws of one prompt
    checked = 0
    for row in range(4):
        prompt = prompts[row // 2]
        tail = tokens[row, 7:]
        for t in range(scores.shape[1]):
            ids = torch.tensor(np.concatenate([prompt, tail[:t]]))[None]
            with torch.no_grad():
                logits = reference(ids).logits[:, -1].float()
            expected = _processors(len(prompt), end)(ids, logits)[0].numpy()
            np.testing.assert_array_equal(np.isinf(scores[row, t]), np.isinf(expected))
            np.testing.assert_allclose(scores[row, t], expected, rtol=1e-4, atol=1e-4)
            assert np.isfinite(scores[row, t, tail[t]])
            log_softmax = torch.log_softmax(torch.tensor(expected), -1)[tail[t]]
            np.testing.assert_allclose(log_probs[row, t], log_softmax, atol=1e-4)
            checked += 1
            if tail[t] == end:
                break
    assert checked >= 30
    # top-k and top-p left few tokens to draw from
    assert np.isfinite(scores[0, :4]).sum(axis=-1).max() <= 20


def test_one_prompt_scores_have_no_batch_axis(gpt2):
    model, _ = gpt2
    out = bm.generate(model, PROMPTS[0], 3, output_scores=True)
    assert out.sequences.shape == (10,) and out.log_probs.shape == (3,)
    assert out.scores.shape == (3, model.config.vocab_size)
    np.testing.assert_array_equal(
        np.asarray(out.sequences[7:]), np.argmax(np.asarray(out.scores), axis=-1)
    )
    np.testing.assert_array_equal(
        np.asarray(out.sequences), np.asarray(bm.generate(model, PROMPTS[0], 3))
    )


def test_ngram_ban_by_hand():
    """The n-gram rule on a row written by hand: left padding (slot 0) and the
    slots from `pos` on are not the row's; an n-gram longer than the row bans
    nothing."""
    ids = jnp.asarray([[9, 1, 2, 3, 1, 2, 4, 1, 2, 7]])
    ends = jnp.asarray([-1])
    rule = jax.jit(apply_rules, static_argnums=6)  # one program per n-gram size
    for n, pos, banned in [(3, 9, {3, 4}), (2, 8, {2}), (3, 6, {3}), (11, 9, set())]:
        tokens = Tokens(ids, jnp.asarray([1]), jnp.int32(pos))
        rules = Rules(ngram=n)
        scores = rule(jnp.zeros((1, 10)), tokens, 0, 1.0, 0.0, ends, rules)
        assert set(np.flatnonzero(np.isinf(np.asarray(scores[0])))) == banned, n
    # left padding is not the row's: (1, 5) at slots 0-1 is no earlier bigram
    for lo, banned in [(1, set()), (0, {5})]:
        tokens = Tokens(jnp.asarray([[1, 5, 2, 1]]), jnp.asarray([lo]), jnp.int32(4))
        scores = rule(jnp.zeros((1, 10)), tokens, 0, 1.0, 0.0, ends, Rules(ngram=2))
        assert set(np.flatnonzero(np.isinf(np.asarray(scores[0])))) == banned


def test_option_argument_errors(gpt2):
    model, _ = gpt2
    ids = PROMPTS[0]
    for bad in (0, -1.2, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="`repetition_penalty` must be a positive"):
            bm.generate(model, ids, 3, repetition_penalty=bad)
    with pytest.raises(TypeError, match="`repetition_penalty` must be a positive"):
        bm.generate(model, ids, 3, repetition_penalty="1.2")
    with pytest.raises(ValueError, match=r"`no_repeat_ngram_size` must be at least 0"):
        bm.generate(model, ids, 3, no_repeat_ngram_size=-1)
    with pytest.raises(TypeError, match="`min_new_tokens` must be an int, got 2.5"):
        bm.generate(model, ids, 3, min_new_tokens=2.5)
    with pytest.raises(TypeError, match="`stop_sequences` must be a non-empty list"):
        bm.generate(model, ids, 3, stop_sequences=[])
    with pytest.raises(TypeError, match=r"`stop_sequences\[1\]` must be a non-empty"):
        bm.generate(model, ids, 3, stop_sequences=[[4], 7])
    with pytest.raises(
        ValueError, match=r"`stop_sequences\[0\]` must be a token id from 0 to 96"
    ):
        bm.generate(model, ids, 3, stop_sequences=[[4, 97]])
    with pytest.raises(
        ValueError, match="`num_return_sequences`=2 with greedy decoding"
    ):
        bm.generate(model, ids, 3, num_return_sequences=2)
    with pytest.raises(ValueError, match="`num_return_sequences` must be at least 1"):
        bm.generate(model, ids, 3, num_return_sequences=0)
