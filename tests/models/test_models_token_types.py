"""BERT's `token_type_ids` are checked against `type_vocab_size` as `input_ids` are
against the vocabulary: an id past the table would read its last row (JAX clamps
gathers) and a negative one would wrap around, silently."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _precision import on_cpu

CONFIG = bm.BertConfig(
    vocab_size=20,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=8,
    type_vocab_size=2,
)


@pytest.fixture(scope="module")
def model():
    return boxwood.nn.inference_mode(bm.BertModel(CONFIG, key=jax.random.key(0)))


IDS = jnp.asarray([3, 4, 5, 6])


@pytest.mark.parametrize("bad", [2, 7, -1])
def test_out_of_range_token_types_raise_eagerly(model, bad):
    with pytest.raises(
        ValueError,
        match=r"BertModel: `token_type_ids` must hold ids from 0 to 1 "
        rf"\(`type_vocab_size` = 2 in the config\); got {bad} at position 2 "
        r"\(1 out of range in all\)",
    ):
        model(IDS, None, jnp.asarray([0, 1, bad, 0]))


def test_out_of_range_token_types_raise_under_jit(model):
    call = boxwood.filter_jit(lambda m, ids, types: m(ids, None, types))
    # Off the CPU the call waits for its result (tests/conftest.py sets
    # BOXWOOD_SYNC_CHECKS=1 there), so the check's error comes from the call.
    with pytest.raises(
        boxwood.BoxwoodRuntimeError,
        match=r"`token_type_ids` must hold ids from 0 to 1 .*got an id outside",
    ):
        call(model, IDS, jnp.asarray([0, 2, 0, 0])).block_until_ready()
    # Under `vmap` the call is traced and cannot wait: off the CPU the failure
    # arrives where the program waits, as JAX's runtime error whose text holds
    # the check's (see boxwood/_jit/_checked_jit.py). The CPU raises boxwood's own.
    errors = (
        boxwood.BoxwoodRuntimeError
        if on_cpu()
        else (boxwood.BoxwoodRuntimeError, jax.errors.JaxRuntimeError)
    )
    with pytest.raises(errors, match="`token_type_ids` must hold ids from 0 to 1"):
        jax.block_until_ready(
            jax.vmap(lambda t: call(model, IDS, t))(
                jnp.asarray([[0, 1, 1, 0], [0, -1, 0, 0]])
            )
        )


def test_valid_token_types_are_unchanged(model):
    types = jnp.asarray([0, 0, 1, 1])
    eager = model(IDS, None, types)

    @boxwood.filter_jit
    def jitted(m, t):  # one program: the given types, none (all 0), and zeros
        return m(IDS, None, t), m(IDS), m(IDS, None, jnp.zeros(4, jnp.int32))

    given, default, zeros = jitted(model, types)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(given), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(default), np.asarray(zeros))


def test_boolean_token_types_are_refused_by_name(model):
    with pytest.raises(
        TypeError, match=r"BertModel: `token_type_ids` must be an integer array"
    ):
        model(IDS, None, jnp.asarray([False, True, True, False]))
