"""`dynamic` (NTK) RoPE scaling in the Llama family against PyTorch `transformers`,
on tiny random checkpoints whose `max_position_embeddings` (16) is passed within
a few tokens: one forward pass, cached decoding, greedy `generate` from short and
long prompts and from a ragged batch, the config's round trip and its errors, and
the documented difference (`transformers` keeps the largest length seen between
calls; boxwood computes each call's frequencies from that call alone).

The weights are drawn wide (`initializer_range=0.4`) so that a wrong frequency
shows in the logits."""

import copy
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import TOKENS, scratch_directory, token_ids, torch, transformers
from _precision import highest_matmul_precision, tolerance  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

ORIGINAL = 16  # `max_position_embeddings`: what `dynamic` scales against
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
SMALL = dict(
    num_hidden_layers=1,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=ORIGINAL,
    initializer_range=0.4,
    **TOKENS,
)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=6)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True)),
    # The tanh GELU by its own name: a transformers that does not rewrite the
    # legacy "gelu" (5.25 does) builds Gemma's MLP from it as the exact GELU,
    # a few 1e-4 off in the logits (tests/models/test_models_edges.py reads "gelu").
    "gemma": (
        "GemmaForCausalLM",
        "GemmaConfig",
        dict(head_dim=8, hidden_act="gelu_pytorch_tanh"),
    ),
}
# relative, as the other exactness tests of the Llama family (a TPU's float32
# differs from the CPU's by more: see tests/_precision.py)
TOLERANCE = tolerance(cpu=2e-5, accelerator=1e-4)


def save_dynamic(kind, directory, rope=DYNAMIC):
    cls_name, config_name, options = FAMILIES[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        **SMALL, **options, rope_parameters=dict(rope)
    )
    reference = getattr(transformers, cls_name)(config).eval()
    reference.save_pretrained(str(directory))


class Pair:
    """A boxwood model and a way to get a fresh `transformers` one (no lengths
    seen yet) with the same weights."""

    def __init__(self, kind, directory):
        self.kind, self.directory = kind, directory
        self.model = bm.from_pretrained(directory)
        cls = getattr(transformers, FAMILIES[kind][0])
        # loaded once and never called: `fresh` hands out copies of it
        self._unused = cls.from_pretrained(str(directory)).eval()

    def fresh(self):
        """A copy of the loaded, never-called `transformers` model: its `dynamic`
        RoPE state is that of a fresh load (a copy costs a fraction of a load)."""
        return copy.deepcopy(self._unused)


@functools.cache
def _pair(kind):
    """`kind`'s checkpoint saved and loaded once per process, for `pair` and
    `llama` alike (the boxwood model is immutable; tests get `transformers`
    models from `fresh`, and read the directory only)."""
    directory = scratch_directory(kind)
    save_dynamic(kind, directory)
    return Pair(kind, directory)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request):
    return _pair(request.param)


@pytest.fixture(scope="module")
def llama():
    return _pair("llama")


@boxwood.filter_jit
def _forward(model, ids):
    return model(ids)


@boxwood.filter_jit
def _decode(model, ids, state, start):
    return model.decode(ids, state, start)


def _hf_logits(reference, ids):
    with torch.no_grad():
        return reference(torch.tensor(ids)[None]).logits[0].numpy()


def _relative_error(out, expected):
    return np.abs(np.asarray(out) - expected).max() / np.abs(expected).max()


def _hf_generate(reference, ids, n, mask=None):
    with torch.no_grad():
        return reference.generate(
            torch.tensor(ids),
            attention_mask=None if mask is None else torch.tensor(mask),
            max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
        ).numpy()  # fmt: skip


# (a shorter call than ORIGINAL takes the same unscaled frequencies as ORIGINAL
# itself, the last length they hold for; short calls are also the prompts of
# `test_greedy_generate_matches_transformers` and `test_a_shorter_call_after_a_longer_one`)
@pytest.mark.parametrize("length", [ORIGINAL, ORIGINAL + 1, 40])
def test_forward_matches_transformers(pair, length):
    """(a) One call: unscaled up to the original length, scaled past it."""
    ids = token_ids(1, (length,))
    out = _forward(pair.model, jnp.asarray(ids))
    expected = _hf_logits(pair.fresh(), ids)
    assert _relative_error(out, expected) <= TOLERANCE, pair.kind


@pytest.mark.parametrize("prompt", [5, 20])
def test_cached_steps_match_transformers_logits(pair, prompt):
    """(b, c) Prefill then one cached step per token, each step's frequencies
    from its own position, the cached keys keeping the rotation they were
    written with: every step's logits are `transformers`' in `generate`."""
    ids = token_ids(2, (prompt,))
    steps = 40 - prompt
    with torch.no_grad():
        hf = pair.fresh().generate(
            torch.tensor(ids)[None], max_new_tokens=steps, do_sample=False,
            eos_token_id=None, pad_token_id=0, output_logits=True,
            return_dict_in_generate=True,
        )  # fmt: skip
    tokens = hf.sequences[0].numpy()
    logits, state = _decode(pair.model, jnp.asarray(ids), pair.model.init_cache(40), 0)
    for i in range(steps):
        expected = hf.logits[i][0].numpy()
        assert _relative_error(logits[-1], expected) <= TOLERANCE, (pair.kind, i)
        token = jnp.asarray(tokens[prompt + i : prompt + i + 1])
        logits, state = _decode(pair.model, token, state, jnp.int32(prompt + i))
    # the cache is not the full forward pass: its keys keep their first rotation
    full = _forward(pair.model, jnp.asarray(tokens[:40]))
    assert np.abs(np.asarray(full[-1]) - np.asarray(logits[-1])).max() > 1e-3


@pytest.mark.parametrize("prompt", [5, 20])
def test_greedy_generate_matches_transformers(pair, prompt):
    """(b) A prompt shorter than the original length that grows past it; (c) one
    already longer (padded to a bucket of 32, whose padding must not count)."""
    ids = token_ids(3, (prompt,))
    out = np.asarray(bm.generate(pair.model, jnp.asarray(ids), 24, eos_token_id=None))
    expected = _hf_generate(pair.fresh(), ids[None], 24)[0]
    np.testing.assert_array_equal(out, expected, err_msg=pair.kind)
    assert len(set(out[prompt:].tolist())) > 3


def test_ragged_batch_matches_transformers(llama):
    """(d) Left-padded prompts of several lengths: as in `transformers`, every
    row's frequencies follow the longest row's positions, so a short row's
    tokens are not those of its prompt alone once the longest row passes the
    original length."""
    prompts = [token_ids(10 + i, (n,)) for i, n in enumerate([5, 12, 9])]
    width = max(len(p) for p in prompts)
    batch = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros_like(batch)
    for row, p in enumerate(prompts):
        batch[row, width - len(p) :], mask[row, width - len(p) :] = p, 1
    out = np.asarray(
        bm.generate(
            llama.model, [jnp.asarray(p) for p in prompts], 24, eos_token_id=None
        )
    )
    expected = _hf_generate(llama.fresh(), batch, 24, mask)
    np.testing.assert_array_equal(out[:, width:], expected[:, width:])
    alone = np.asarray(
        bm.generate(llama.model, jnp.asarray(prompts[0]), 24, eos_token_id=None)
    )
    assert (alone[len(prompts[0]) :] != out[0, width:]).any()


def test_a_shorter_call_after_a_longer_one(llama):
    """The documented difference: `transformers` keeps the frequencies of the
    longest call (40 tokens) for a later shorter one that is still past the
    original length (30); boxwood's are the 30-token call's own, a fresh
    model's. Below the original length both are unscaled."""
    ids = token_ids(4, (40,))
    reference = llama.fresh()
    _hf_logits(reference, ids)
    stateful = _hf_logits(reference, ids[:30])
    out = _forward(llama.model, jnp.asarray(ids[:30]))
    assert _relative_error(out, _hf_logits(llama.fresh(), ids[:30])) <= TOLERANCE
    assert _relative_error(out, stateful) > 1e-2
    short = _hf_logits(reference, ids[:10])  # resets to the unscaled frequencies
    out = _forward(llama.model, jnp.asarray(ids[:10]))
    assert _relative_error(out, short) <= TOLERANCE


def test_scaling_matters(llama, tmp_path):
    """Read without the scaling, the checkpoint gives other logits past the
    original length (so the tests above can fail) and the same ones up to it."""
    config = json.loads((llama.directory / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    config["max_position_embeddings"] = 64
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(llama.directory / "model.safetensors")
    plain = bm.from_pretrained(tmp_path)
    ids = jnp.asarray(token_ids(5, (40,)))
    long, plain_long = _forward(llama.model, ids), _forward(plain, ids)
    assert _relative_error(long, np.asarray(plain_long)) > 1e-2
    short = _forward(llama.model, ids[:ORIGINAL])
    assert _relative_error(short, np.asarray(_forward(plain, ids[:ORIGINAL]))) <= 1e-6


def test_config_round_trip(llama, tmp_path):
    model = llama.model
    assert model.config.rope_scaling == (("factor", 2.0), ("rope_type", "dynamic"))
    assert model.uses_extent and model.max_positions > 10**6
    bm.save_pretrained(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_parameters"] == DYNAMIC
    assert written["max_position_embeddings"] == ORIGINAL
    assert bm.from_pretrained(tmp_path).config == model.config
    loaded = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path)).eval()
    ids = token_ids(6, (30,))
    np.testing.assert_array_equal(
        _hf_logits(loaded, ids), _hf_logits(llama.fresh(), ids)
    )
    legacy = bm.LlamaConfig.from_dict(
        {"rope_theta": 500.0, "rope_scaling": {"type": "dynamic", "factor": 4.0}}
    )
    assert legacy.rope_scaling == (("factor", 4.0), ("rope_type", "dynamic"))
    assert legacy.to_dict()["rope_parameters"] == {
        "rope_type": "dynamic",
        "rope_theta": 500.0,
        "factor": 4.0,
    }


def test_other_scalings_are_not_dynamic():
    config = bm.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=ORIGINAL,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )  # fmt: skip
    model = bm.LlamaForCausalLM(config, key=jax.random.key(0))
    assert not model.uses_extent and model.max_positions == ORIGINAL
    with pytest.raises(ValueError, match="more than the model's 16 positions"):
        model(jnp.zeros(ORIGINAL + 1, jnp.int32))


def test_bad_dynamic_configs_are_named():
    with pytest.raises(bm.ConfigError, match="`rope_type` = 'dynamic' needs factor"):
        bm.LlamaConfig.from_dict({"rope_parameters": {"rope_type": "dynamic"}})
    with pytest.raises(
        bm.ConfigError,
        match="the key `original_max_position_embeddings` \\(= 8\\) is not supported "
        "for `rope_type` = 'dynamic'; it takes factor",
    ):
        bm.LlamaConfig.from_dict(
            {
                "rope_scaling": {
                    "rope_type": "dynamic",
                    "factor": 2.0,
                    "original_max_position_embeddings": 8,
                }
            }
        )
    with pytest.raises(bm.ConfigError, match="'dynamic' needs factor"):
        bm.LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": None})
