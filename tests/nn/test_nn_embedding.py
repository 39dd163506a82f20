import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.nn as nn


def test_lookup(getkey):
    emb = nn.Embedding(6, 3, key=getkey())
    assert emb.weight.shape == (6, 3)
    np.testing.assert_array_equal(emb(4), emb.weight[4])
    np.testing.assert_array_equal(emb(jnp.int32(0)), emb.weight[0])
    np.testing.assert_array_equal(emb(np.int64(5)), emb.weight[5])


def test_normal_init(getkey):
    emb = nn.Embedding(200, 50, key=getkey())
    assert abs(float(emb.weight.mean())) < 0.03
    assert abs(float(emb.weight.std()) - 1.0) < 0.03


def test_from_weight():
    table = jnp.arange(12.0).reshape(4, 3)
    emb = nn.Embedding(weight=table)
    assert (emb.num_embeddings, emb.embedding_size) == (4, 3)
    np.testing.assert_array_equal(emb(2), table[2])
    emb = nn.Embedding(4, 3, weight=table)
    assert emb.weight is table


def test_vmap_and_jit(getkey):
    emb = nn.Embedding(6, 3, key=getkey())
    idx = jnp.array([0, 5, 2, 2])
    out = jax.jit(lambda e, i: jax.vmap(e)(i))(emb, idx)
    np.testing.assert_array_equal(out, emb.weight[idx])
    assert jax.tree_util.tree_leaves(emb) == [emb.weight]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_dtype(getkey, dtype):
    emb = nn.Embedding(6, 3, dtype=dtype, key=getkey())
    assert emb.weight.dtype == dtype
    y = emb(1)
    assert y.dtype == dtype and np.isfinite(np.asarray(y)).all()


def test_gradient_flows_to_row(getkey):
    emb = nn.Embedding(4, 2, key=getkey())
    grad = jax.grad(lambda e: e(1).sum())(emb)
    expected = jnp.zeros((4, 2)).at[1].set(1.0)
    np.testing.assert_array_equal(grad.weight, expected)


def test_call_errors(getkey):
    emb = nn.Embedding(6, 3, key=getkey())
    with pytest.raises(
        ValueError,
        match=r"Embedding\(num_embeddings=6, embedding_size=3\): expected a scalar "
        r"index of shape \(\), got \(2,\).*jax.vmap",
    ):
        emb(jnp.array([1, 2]))
    with pytest.raises(
        TypeError, match=r"expected an integer index, got dtype float32"
    ):
        emb(jnp.float32(1.0))
    with pytest.raises(TypeError, match="integer index, got dtype bool"):
        emb(jnp.bool_(True))
    with pytest.raises(IndexError, match=r"index 6 is out of range \[-6, 6\)"):
        emb(6)
    with pytest.raises(IndexError, match=r"index -7 is out of range"):
        emb(-7)
    # a negative index counts from the end, as in Equinox
    assert jnp.array_equal(emb(-1), emb.weight[5])


def test_construction_errors(getkey):
    with pytest.raises(ValueError, match=r"pass either `Embedding\(num_embeddings"):
        nn.Embedding(3, 2)
    with pytest.raises(ValueError, match="`num_embeddings` must be a non-negative int"):
        nn.Embedding(-3, 2, key=getkey())
    with pytest.raises(ValueError, match=r"Got a table of shape \(3,\)"):
        nn.Embedding(weight=jnp.ones(3))
    with pytest.raises(
        ValueError, match=r"`weight` has shape \(3, 2\), but .* say \(4, 2\)"
    ):
        nn.Embedding(4, weight=jnp.ones((3, 2)))
