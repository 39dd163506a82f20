import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood.nn as nn


def test_training_scales_kept_entries(getkey):
    dropout = nn.Dropout(0.25)
    x = jr.normal(getkey(), (4000,)) + 3.0
    y = dropout(x, key=getkey())
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-6)
    frac = float(jnp.mean(kept))
    assert abs(frac - 0.75) < 0.05
    # A different key zeroes different entries.
    assert not jnp.array_equal(kept, dropout(x, key=getkey()) != 0)


def test_inference_is_identity(getkey):
    x = jr.normal(getkey(), (10,))
    assert nn.Dropout(0.5, inference=True)(x) is x
    assert nn.Dropout(0.5)(x, inference=True) is x
    assert nn.Dropout(0.0)(x) is x  # p=0 needs no key


def test_call_time_inference_overrides_field(getkey):
    x = jnp.ones(200)
    dropout = nn.Dropout(0.5, inference=True)
    y = dropout(x, key=getkey(), inference=False)
    assert jnp.any(y == 0) and jnp.any(y == 2.0)


def test_p_one_gives_zeros_and_finite_grad(getkey):
    dropout = nn.Dropout(1.0)
    x = jnp.arange(1.0, 5.0)
    np.testing.assert_array_equal(dropout(x, key=getkey()), jnp.zeros(4))
    key = getkey()
    grad = jax.grad(lambda x: dropout(x, key=key).sum())(x)
    np.testing.assert_array_equal(grad, jnp.zeros(4))


def test_missing_key_error():
    with pytest.raises(
        RuntimeError, match=r"needs a random key.*key=key.*inference_mode"
    ):
        nn.Dropout(0.5)(jnp.ones(3))


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_p_out_of_range(p):
    with pytest.raises(ValueError, match=r"`Dropout.p` must be in \[0, 1\]"):
        nn.Dropout(p)


def test_p_must_be_python_number():
    with pytest.raises(TypeError, match="`Dropout.p` must be a Python float"):
        nn.Dropout(jnp.array(0.5))


def test_static_fields_and_jit(getkey):
    dropout = nn.Dropout(0.5)
    assert jax.tree_util.tree_leaves(dropout) == []
    x = jnp.ones(100)
    key = getkey()
    out = jax.jit(lambda d, x, k: d(x, key=k))(dropout, x, key)
    np.testing.assert_array_equal(out, dropout(x, key=key))
    assert jax.tree_util.tree_structure(dropout) != jax.tree_util.tree_structure(
        nn.Dropout(0.5, inference=True)
    )


def test_vmap_with_keys(getkey):
    """Under `vmap` each row's threefry mask is the one its key gives alone (the
    TPU's generator draws a batch from the first row's key instead: see
    tests/nn/test_nn_dropout_generator.py)."""
    dropout = nn.Dropout(0.5)
    xs = jnp.ones((3, 50))
    keys = jr.split(getkey(), 3)
    with nn.dropout_generator("threefry"):
        ys = jax.vmap(lambda x, k: dropout(x, key=k))(xs, keys)
        alone = dropout(xs[2], key=keys[2])
    assert ys.shape == (3, 50)
    assert not jnp.array_equal(ys[0], ys[1])
    np.testing.assert_array_equal(ys[2], alone)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision(getkey, dtype):
    y = nn.Dropout(0.5)(jnp.ones(64, dtype), key=getkey())
    assert y.dtype == dtype
    assert set(np.unique(np.asarray(y, np.float32))) <= {0.0, 2.0}


def test_deterministic_is_the_deprecated_spelling_of_inference():
    x = jnp.ones(5)
    with pytest.warns(DeprecationWarning, match=r"Dropout\(deterministic=...\)"):
        dropout = nn.Dropout(0.5, deterministic=True)
    assert dropout.inference is True and dropout.deterministic is True
    np.testing.assert_array_equal(dropout(x), x)  # no key needed: identity
    train = nn.Dropout(0.5)
    assert train.deterministic is False
    with pytest.warns(DeprecationWarning, match=r"pass `inference=...` instead"):
        np.testing.assert_array_equal(train(x, deterministic=True), x)
    with pytest.warns(DeprecationWarning), pytest.raises(RuntimeError, match="key"):
        train(x, deterministic=False)
