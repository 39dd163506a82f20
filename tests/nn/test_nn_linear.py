import math

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _precision import tolerance


def test_shapes_and_values(getkey):
    linear = nn.Linear(3, 4, key=getkey())
    x = jr.normal(getkey(), (3,))
    y = linear(x)
    assert y.shape == (4,)
    np.testing.assert_allclose(y, linear.weight @ x + linear.bias, rtol=1e-6)


def test_no_bias(getkey):
    linear = nn.Linear(3, 4, use_bias=False, key=getkey())
    assert linear.bias is None
    x = jr.normal(getkey(), (3,))
    np.testing.assert_allclose(linear(x), linear.weight @ x, rtol=1e-6)


@pytest.mark.parametrize(
    "i, o, xshape, yshape",
    [("scalar", 3, (), (3,)), (3, "scalar", (3,), ()), ("scalar", "scalar", (), ())],
)
def test_scalar_features(getkey, i, o, xshape, yshape):
    linear = nn.Linear(i, o, key=getkey())
    n_in = 1 if i == "scalar" else i
    n_out = 1 if o == "scalar" else o
    assert linear.weight.shape == (n_out, n_in)
    y = linear(jnp.ones(xshape))
    assert y.shape == yshape
    expected = linear.weight.sum(axis=1) + linear.bias
    np.testing.assert_allclose(jnp.reshape(y, (-1,)), expected, rtol=1e-6)


def test_init_within_pytorch_bounds(getkey):
    linear = nn.Linear(16, 64, key=getkey())
    bound = 1 / math.sqrt(16)
    assert (np.abs(np.asarray(linear.weight)) <= bound).all()
    assert (np.abs(np.asarray(linear.bias)) <= bound).all()
    # Uniform over the whole interval, not a narrower one.
    assert jnp.max(jnp.abs(linear.weight)) > 0.9 * bound
    assert abs(float(jnp.std(linear.weight)) - bound / math.sqrt(3)) < 0.02


def test_vmap(getkey):
    linear = nn.Linear(3, 2, key=getkey())
    xs = jr.normal(getkey(), (5, 3))
    ys = jax.vmap(linear)(xs)
    assert ys.shape == (5, 2)
    # a TPU's batched product groups its sums otherwise than the single one's
    np.testing.assert_allclose(
        ys[2],
        linear(xs[2]),
        rtol=tolerance(cpu=1e-6, accelerator=1e-5),
        atol=tolerance(cpu=0.0, accelerator=1e-6),
    )


def test_a_batched_product_and_its_derivatives_need_no_transpose(getkey):
    # the input comes first in the product, so `vmap` puts the batch axes where
    # the result keeps them (with `weight @ x`: two transposes)
    linear = nn.Linear(3, 5, key=getkey())
    xs = jr.normal(getkey(), (4, 6, 3))

    def loss(linear, xs):
        return jnp.sum(jax.vmap(jax.vmap(linear))(xs) ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(linear, xs).jaxpr
    names = [e.primitive.name for e in jaxpr.eqns]
    assert names.count("dot_general") == 3 and "transpose" not in names, names
    g_linear, g_xs = jax.grad(loss, argnums=(0, 1))(linear, xs)
    ys = xs @ linear.weight.T + linear.bias[None, None]
    np.testing.assert_allclose(g_xs, 2 * ys @ linear.weight, rtol=1e-5, atol=1e-6)
    expected = 2 * jnp.einsum("bso,bsi->oi", ys, xs)
    np.testing.assert_allclose(g_linear.weight, expected, rtol=1e-5, atol=1e-5)


def test_jit_and_pytree(getkey):
    linear = nn.Linear(3, 2, key=getkey())
    leaves = jax.tree_util.tree_leaves(linear)
    assert len(leaves) == 2 and all(boxwood.is_array(leaf) for leaf in leaves)
    x = jnp.ones(3)
    out = jax.jit(lambda m, x: m(x))(linear, x)
    np.testing.assert_allclose(out, linear(x), rtol=1e-6)
    out = jax.jit(nn.Linear.__call__)(linear, x)
    np.testing.assert_allclose(out, linear(x), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_dtype(getkey, dtype):
    linear = nn.Linear(3, 2, dtype=dtype, key=getkey())
    assert linear.weight.dtype == dtype and linear.bias.dtype == dtype
    y = linear(jnp.ones(3, dtype))
    assert y.dtype == dtype
    assert np.isfinite(np.asarray(y)).all()


def test_shape_errors(getkey):
    linear = nn.Linear(3, 2, key=getkey())
    with pytest.raises(
        ValueError,
        match=r"Linear\(in_features=3\): expected input of shape \(3,\), got \(4,\)\.",
    ):
        linear(jnp.ones(4))
    with pytest.raises(ValueError, match=r"got \(2, 3\)"):
        linear(jnp.ones((2, 3)))
    scalar = nn.Linear("scalar", 2, key=getkey())
    with pytest.raises(
        ValueError,
        match=r"Linear\(in_features='scalar'\): expected input of shape \(\), got \(1,\)",
    ):
        scalar(jnp.ones(1))


def test_construction_errors(getkey):
    with pytest.raises(ValueError, match="`in_features` must be a non-negative int"):
        nn.Linear(-1, 2, key=getkey())
    with pytest.raises(ValueError, match="`out_features`"):
        nn.Linear(2, "vector", key=getkey())
    with pytest.raises(TypeError, match="`dtype` must be a floating-point"):
        nn.Linear(2, 2, dtype=jnp.int32, key=getkey())


def test_identity():
    identity = nn.Identity(1, 2, foo=3)
    x = {"a": jnp.ones(2)}
    assert identity(x, key=None) is x
    assert jax.tree_util.tree_leaves(identity) == []
