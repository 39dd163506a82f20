"""MultiheadAttention's dropout draws Equinox's masks (one key per head), so a model
trained with attention dropout gives Equinox's numbers."""

import io

import jax
import numpy as np
import pytest

import boxwood
import boxwood.nn as bnn

eqx = pytest.importorskip("equinox")


def test_attention_dropout_matches_equinox():
    theirs = eqx.nn.MultiheadAttention(4, 8, dropout_p=0.5, key=jax.random.key(0))
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, theirs)
    buffer.seek(0)
    like = bnn.MultiheadAttention(4, 8, dropout_p=0.5, key=jax.random.key(1))
    ours = boxwood.tree_deserialise_leaves(buffer, like)
    x = jax.random.normal(jax.random.key(2), (5, 8))
    # both layers in one compiled program (eagerly, each operation would compile
    # on its own), run for every key
    both = boxwood.filter_jit(
        lambda a, b, key, **kw: (a(x, x, x, key=key, **kw), b(x, x, x, key=key, **kw))
    )
    # with threefry's masks, as Equinox draws them (on a TPU boxwood's default is
    # the chip's own generator, whose masks differ)
    with bnn.dropout_generator("threefry"):
        for seed in range(3):
            got, want = both(ours, theirs, jax.random.key(seed))
            np.testing.assert_allclose(got, want, atol=1e-5)
    # inference mode: no dropout, no key needed
    np.testing.assert_allclose(*both(ours, theirs, None, inference=True), atol=1e-5)
