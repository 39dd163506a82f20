"""`output_hidden_states=True` against `transformers`' `hidden_states`: the
embeddings' output and every layer's, from the scanned stack of layers (the
causal LMs' last one normalised, ViT's not), for the base models; the heads'
are checked beside their logits in their own test files."""

import jax
import numpy as np
import pytest

import boxwood
from _hf_models import WIDE, shared_model, token_ids, torch
from _precision import highest_matmul_precision  # noqa: F401

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

TOL = 1e-4  # of the values' scale (Gemma's hidden states are several times 1)


def _close(ours, theirs):
    """Equal to `TOL` of the larger of 1 and the values' largest magnitude: a TPU
    computes `highest`-precision products and the activations' transcendental
    functions a few ulps apart from the CPU, and that error grows with scale."""
    theirs = np.asarray(theirs)
    scale = max(1.0, float(np.abs(theirs).max()))
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=TOL * scale)


IDS = token_ids(7, (2, 6))
MASK = np.array([[0, 0, 1, 1, 1, 1], [1] * 6])  # the first row left-padded
TYPES = np.array([[0, 0, 0, 1, 1, 1], [0] * 6])


@boxwood.filter_jit
def _every(model, *args):
    return jax.vmap(lambda *a: model(*a, output_hidden_states=True))(*args)


def _theirs(reference, **inputs):
    with torch.no_grad():
        out = reference(
            **{k: torch.tensor(v) for k, v in inputs.items()},
            output_hidden_states=True,
        )
    return out, np.stack([h.numpy() for h in out.hidden_states], axis=1)


def _at_real_tokens(hidden, mask):
    """`hidden` `(batch, layers, seq, width)` with padding positions zeroed (what
    a padded position holds is not specified)."""
    return np.where(np.asarray(mask, bool)[:, None, :, None], hidden, 0.0)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gemma"])
def test_causal_lm_hidden_states_match_transformers(kind):
    model, reference = shared_model(kind, **WIDE)
    logits, hidden = _every(model, IDS, MASK)
    theirs, expected = _theirs(reference, input_ids=IDS, attention_mask=MASK)
    layers = model.config.to_dict().get("n_layer") or model.config.num_hidden_layers
    assert hidden.shape == (2, layers + 1, 6, 32) == expected.shape
    _close(_at_real_tokens(hidden, MASK), _at_real_tokens(expected, MASK))
    real = MASK.astype(bool)
    _close(logits[real], theirs.logits.numpy()[real])
    # the last entry is the final (normalised) hidden state the logits come from
    _close(hidden[:, -1] @ np.asarray(model.output_embedding()).T, logits)


def test_bert_hidden_states_match_transformers():
    model, reference = shared_model("bert")
    last, hidden = _every(model, IDS, MASK, TYPES)
    theirs, expected = _theirs(
        reference, input_ids=IDS, attention_mask=MASK, token_type_ids=TYPES
    )
    assert hidden.shape == (2, 3, 6, 32) == expected.shape
    real = MASK.astype(bool)
    _close(_at_real_tokens(hidden, MASK), _at_real_tokens(expected, MASK))
    _close(last[real], theirs.last_hidden_state.numpy()[real])
    np.testing.assert_array_equal(hidden[:, -1], last)


def test_vit_hidden_states_match_transformers():
    model, reference = shared_model("vit", **WIDE)
    pixels = np.random.RandomState(3).standard_normal((2, 3, 16, 16))
    pixels = pixels.astype(np.float32)
    logits, hidden = _every(model, pixels)
    theirs, expected = _theirs(reference, pixel_values=pixels)
    assert hidden.shape == (2, 3, 17, 32) == expected.shape
    _close(hidden, expected)
    _close(logits, theirs.logits.numpy())


def test_hidden_states_in_training_mode_and_unrolled():
    """Under dropout (the embeddings' output is taken after it) and with the
    blocks applied without a scan, the entries are the same computation."""
    model, _ = shared_model("gpt2", **WIDE)
    training = boxwood.nn.inference_mode(model, False)
    key = jax.random.key(1)
    call = boxwood.filter_jit(lambda m: m(IDS[1], key=key, output_hidden_states=True))
    logits, hidden = call(training)
    unrolled_logits, unrolled = call(training.with_unroll(True))
    np.testing.assert_allclose(unrolled, hidden, atol=1e-5)
    np.testing.assert_allclose(unrolled_logits, logits, atol=1e-5)
    eval_hidden = _every(model, IDS, MASK)[1][1]
    assert not np.allclose(hidden[0], eval_hidden[0])  # dropout on the embeddings
