"""`attention_mask` of the causal LMs: padded rows (left or right) give
`transformers`' logits at their real positions (positions counted from the first
column, as its forward counts them), `causal_lm_loss` leaves padding out, and a
mask holding anything but 0 and 1 is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _hf_models import WIDE, shared_model, token_ids, torch
from _precision import highest_matmul_precision  # noqa: F401

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

TOL = 1e-4
KINDS = ["gpt2", "llama", "mistral", "qwen2", "gemma"]
# row 0 left-padded by 3, row 1 right-padded by 4, row 2 not padded
MASK = np.ones((3, 12), np.int64)
MASK[0, :3] = 0
MASK[1, 8:] = 0
IDS = token_ids(5, (3, 12))


@boxwood.filter_jit
def _forward(model, ids, mask):
    return jax.vmap(model)(ids, mask)


@boxwood.filter_jit
def _loss(model, ids, mask):
    return bm.causal_lm_loss(model, ids, attention_mask=mask)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_rows_give_transformers_logits_at_real_positions(kind):
    model, reference = shared_model(kind, **WIDE)
    ours = np.asarray(_forward(model, jnp.asarray(IDS), jnp.asarray(MASK)))
    with torch.no_grad():
        out = reference(torch.tensor(IDS), attention_mask=torch.tensor(MASK))
    theirs = out.logits.numpy()
    real = MASK.astype(bool)
    assert np.abs(ours[real] - theirs[real]).max() <= TOL
    assert np.isfinite(ours).all()  # padding attends to padding: finite
    # the unpadded row is the plain forward's
    plain = np.asarray(_forward(model, jnp.asarray(IDS), jnp.ones((3, 12), jnp.int32)))
    np.testing.assert_allclose(ours[2], plain[2], atol=1e-6)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_loss_leaves_padding_out(kind):
    model, reference = shared_model(kind, **WIDE)
    loss = float(_loss(model, jnp.asarray(IDS), jnp.asarray(MASK)))
    # `transformers`' loss with every target that is padding, or predicted from
    # padding (the first real token of a left-padded row), ignored
    labels = np.where(MASK == 1, IDS, -100)
    labels[0, 3] = -100
    with torch.no_grad():
        theirs = reference(
            torch.tensor(IDS),
            attention_mask=torch.tensor(MASK),
            labels=torch.tensor(labels),
        ).loss.item()
    assert abs(loss - theirs) < 1e-4
    # the mean is over real targets: a right-padded row alone is its unpadded loss
    # (the other rows all padding)
    alone = _loss(model, jnp.asarray(IDS[1:2, :8]), jnp.ones((1, 8), jnp.int32))
    only_row_1 = jnp.asarray(MASK * np.eye(3, 1, -1, dtype=np.int64))
    padded = _loss(model, jnp.asarray(IDS), only_row_1)
    assert abs(float(alone) - float(padded)) < 1e-5


def test_hidden_states_and_a_list_mask():
    model, _ = shared_model("llama", **WIDE)
    ids, mask = IDS[0], MASK[0]
    logits = model(jnp.asarray(ids), mask.tolist())
    hidden = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask, bool))
    np.testing.assert_allclose(
        np.asarray(hidden @ model.output_embedding().T)[3:],
        np.asarray(logits)[3:],
        atol=1e-5,
    )


def test_a_mask_of_other_values_is_refused():
    model, _ = shared_model("gpt2", **WIDE)
    ids = jnp.asarray(IDS[0])
    bad = jnp.asarray(MASK[0]).at[5].set(2)
    message = (
        r"GPT2LMHeadModel: `attention_mask` must hold only 1 \(a real token\) and 0"
    )
    with pytest.raises(ValueError, match=message + r".*got 2 at position 5"):
        model(ids, bad)
    with pytest.raises(boxwood.BoxwoodRuntimeError, match=message):
        boxwood.filter_jit(model)(ids, bad)
    with pytest.raises(
        ValueError, match=r"`causal_lm_loss`: `attention_mask` must hold"
    ):
        bm.causal_lm_loss(model, ids[None], attention_mask=bad[None])
    with pytest.raises(ValueError, match=r"`attention_mask` has shape \(4,\)"):
        model(ids, jnp.ones(4, jnp.int32))


def test_decode_over_a_cache_takes_pad_not_a_mask():
    model, _ = shared_model("gpt2", **WIDE)
    ids = jnp.asarray(IDS[0, :4])
    with pytest.raises(ValueError, match="over a cache, give the left padding"):
        model.decode(ids, model.init_cache(8), 0, attention_mask=jnp.ones(4, int))
