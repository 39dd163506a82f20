import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.nn as nn


def test_default_slope():
    prelu = nn.PReLU()
    assert (
        prelu.negative_slope.shape == () and prelu.negative_slope.dtype == jnp.float32
    )
    np.testing.assert_allclose(prelu.negative_slope, 0.25)
    x = jnp.array([-4.0, -1.0, 0.5, 3.0])
    np.testing.assert_allclose(prelu(x), jnp.array([-1.0, -0.25, 0.5, 3.0]))


def test_per_channel_slope():
    prelu = nn.PReLU(jnp.array([[0.1], [0.5]]))
    x = -jnp.ones((2, 3))
    np.testing.assert_allclose(prelu(x), jnp.array([[-0.1] * 3, [-0.5] * 3]))
    assert nn.PReLU(jnp.array([0.1, 0.2, 0.3]))(-jnp.ones((2, 3))).shape == (2, 3)


def test_slope_is_learnable():
    prelu = nn.PReLU(0.3)
    x = jnp.array([-2.0, 1.0])
    grads = jax.grad(lambda m: m(x).sum())(prelu)
    np.testing.assert_allclose(grads.negative_slope, -2.0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_dtype(dtype):
    prelu = nn.PReLU(dtype=dtype)
    assert prelu.negative_slope.dtype == dtype
    y = prelu(jnp.array([-1.0, 2.0], dtype))
    assert y.dtype == dtype and np.isfinite(np.asarray(y)).all()
    assert nn.PReLU(jnp.array(0.1, jnp.bfloat16)).negative_slope.dtype == jnp.bfloat16
    # a float32 slope applied to a bf16 input gives a bf16 output
    assert nn.PReLU()(jnp.ones(2, dtype)).dtype == dtype


def test_vmap_jit():
    prelu = nn.PReLU(jnp.array([0.1, 0.2]))
    xs = -jnp.ones((4, 2))
    ys = jax.jit(lambda m, xs: jax.vmap(m)(xs))(prelu, xs)
    np.testing.assert_allclose(ys, jnp.tile(jnp.array([-0.1, -0.2]), (4, 1)), rtol=1e-6)


def test_shape_error():
    prelu = nn.PReLU(jnp.array([0.1, 0.2, 0.3]))
    with pytest.raises(
        ValueError,
        match=r"PReLU\(negative_slope.shape=\(3,\)\): the slope does not broadcast to "
        r"the input of shape \(3, 2\)",
    ):
        prelu(jnp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"input of shape \(\)"):
        prelu(jnp.float32(1.0))
