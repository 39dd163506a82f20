import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _jaxprs import primitive_names
from _precision import tolerance


@pytest.fixture
def normal():
    """`normal(*shape)`: standard normal float32 inputs (NumPy-generated, so that
    tests do not compile a random-number kernel per shape)."""
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


class Tensor3(boxwood.Module):
    """A layer with a 3-D weight, like a convolution's."""

    weight: jax.Array

    def __call__(self, x):
        return jnp.einsum("oij,ij->o", self.weight, x)


def top_singular_value(matrix):
    return float(jnp.linalg.svd(matrix, compute_uv=False)[0])


# ----------------------------------------------------------------------------- WeightNorm


def test_weight_norm_starts_equal_and_separates_magnitude(getkey, normal):
    linear = nn.Linear(3, 4, key=getkey())
    wn = nn.WeightNorm(linear)
    assert wn.g.shape == (4, 1)
    x = normal(3)
    np.testing.assert_allclose(wn(x), linear(x), atol=1e-6)
    doubled = boxwood.tree_at(lambda m: m.g, wn, 2 * wn.g)
    np.testing.assert_allclose(
        doubled(x) - linear.bias, 2 * (linear(x) - linear.bias), atol=1e-5
    )
    # Rescaling the direction v changes nothing.
    scaled = boxwood.tree_at(lambda m: m.layer.weight, wn, 5 * linear.weight)
    np.testing.assert_allclose(scaled(x), wn(x), atol=1e-5)
    np.testing.assert_allclose(
        jnp.linalg.norm(scaled.normalised_weight(), axis=1), wn.g[:, 0], rtol=1e-5
    )


def test_weight_norm_axes(getkey, normal):
    layer = Tensor3(normal(2, 3, 4))
    assert nn.WeightNorm(layer).g.shape == (2, 1, 1)
    assert nn.WeightNorm(layer, axis=-1).g.shape == (1, 1, 4)
    assert nn.WeightNorm(layer, axis=-1).axis == 2
    whole = nn.WeightNorm(layer, axis=None)
    assert whole.g.shape == (1, 1, 1)
    # (a TPU sums the 24 squares in another order and its einsum in bfloat16 pieces)
    np.testing.assert_allclose(
        whole.g.reshape(()),
        jnp.linalg.norm(layer.weight.ravel()),
        rtol=tolerance(cpu=1e-6, accelerator=1e-5),
    )
    x = normal(3, 4)
    np.testing.assert_allclose(
        whole(x), layer(x), atol=tolerance(cpu=1e-5, accelerator=1e-4)
    )


def test_weight_norm_takes_a_square_root_not_a_power(getkey, normal):
    # a TPU computes `pow(x, 0.5)` as `exp(0.5 * log(x))`, several float32 ulps
    # from `sqrt`, in the forward pass and in the gradient
    wn = nn.WeightNorm(nn.Linear(3, 4, key=getkey()))
    x = normal(3)
    forward = primitive_names(jax.make_jaxpr(wn)(x).jaxpr)
    backward = primitive_names(jax.make_jaxpr(jax.grad(lambda m: m(x).sum()))(wn).jaxpr)
    assert "sqrt" in forward and "pow" not in forward | backward


def test_weight_norm_bf16_and_jit(getkey):
    wn = nn.WeightNorm(nn.Linear(3, 2, dtype=jnp.bfloat16, key=getkey()))
    assert wn.g.dtype == jnp.bfloat16
    y = jax.jit(lambda m, x: m(x))(wn, jnp.ones(3, jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        y.astype(jnp.float32),
        wn.layer(jnp.ones(3, jnp.bfloat16)).astype(jnp.float32),
        atol=0.05,
    )


def test_weight_norm_gradients_match_torch(getkey, normal):
    torch = pytest.importorskip("torch")
    linear = nn.Linear(3, 2, key=getkey())
    tlin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        tlin.weight.copy_(torch.tensor(np.asarray(linear.weight)))
        tlin.bias.copy_(torch.tensor(np.asarray(linear.bias)))
    tlin = torch.nn.utils.parametrizations.weight_norm(tlin)
    wn = nn.WeightNorm(linear)
    wn = boxwood.tree_at(lambda m: m.g, wn, 1.5 * wn.g)
    with torch.no_grad():
        tlin.parametrizations.weight.original0.mul_(1.5)
    x = np.asarray(normal(3))
    ty = tlin(torch.tensor(x)[None])
    (ty**2).sum().backward()
    y = wn(jnp.asarray(x))
    # (jitted: one program, not one per operation of the backward pass)
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m(jnp.asarray(x)) ** 2)))(wn)
    np.testing.assert_allclose(y, ty[0].detach().numpy(), atol=1e-5)
    params = tlin.parametrizations.weight
    np.testing.assert_allclose(grads.g, params.original0.grad.numpy(), atol=1e-5)
    np.testing.assert_allclose(
        grads.layer.weight, params.original1.grad.numpy(), atol=1e-5
    )


def test_weight_norm_errors(getkey):
    linear = nn.Linear(3, 4, key=getkey())
    with pytest.raises(
        ValueError, match="WeightNorm: the wrapped Linear has no array attribute 'w'"
    ):
        nn.WeightNorm(linear, weight_name="w")
    with pytest.raises(ValueError, match="`axis=2` is out of range"):
        nn.WeightNorm(linear, axis=2)


# --------------------------------------------------------------------------- SpectralNorm


@jax.jit  # one program, not one per operation
def effective_matrix(sn, state, x):
    """The normalised weight, read off as the Jacobian of the wrapped linear map."""
    return jax.jacfwd(lambda x: sn(x, state, inference=True)[0])(x)


def test_spectral_norm_largest_singular_value_is_one(getkey, normal):
    linear = nn.Linear(5, 4, key=getkey())
    linear = boxwood.tree_at(lambda m: m.weight, linear, 3 * linear.weight)
    assert abs(top_singular_value(linear.weight) - 1) > 0.1
    sn, state = nn.make_with_state(nn.SpectralNorm)(linear, "weight", key=getkey())
    step = jax.jit(lambda sn, x, state: sn(x, state))
    x = normal(5)
    for _ in range(10):
        _, state = step(sn, x, state)
    assert abs(top_singular_value(effective_matrix(sn, state, x)) - 1) < 1e-3


def test_spectral_norm_power_iterations_converge_from_a_stale_state(getkey, normal):
    sn, state = nn.make_with_state(nn.SpectralNorm)(
        nn.Linear(6, 6, key=getkey()), "weight", key=getkey()
    )
    # A new weight: the stored u, v belong to the old one.
    new_weight = normal(6, 6)
    sn = boxwood.tree_at(lambda m: m.layer.weight, sn, new_weight)
    x = jnp.ones(6)
    _, unchanged = sn(x, state, inference=True)
    np.testing.assert_array_equal(
        unchanged.get(sn.uv_index)[0], state.get(sn.uv_index)[0]
    )
    step = jax.jit(lambda sn, x, state: sn(x, state))
    for _ in range(100):
        _, state = step(sn, x, state)
    expected = new_weight / top_singular_value(new_weight)
    # (on a TPU the SVD of the reference and the iterations are each a few ulps off)
    np.testing.assert_allclose(
        effective_matrix(sn, state, x),
        expected,
        atol=tolerance(cpu=1e-3, accelerator=3e-3),
    )


def test_spectral_norm_inference_mode_keeps_state(getkey, normal):
    sn, state = nn.make_with_state(nn.SpectralNorm)(
        nn.Linear(3, 3, key=getkey()), "weight", key=getkey()
    )
    sn = boxwood.tree_at(lambda m: m.layer.weight, sn, normal(3, 3))
    u0 = state.get(sn.uv_index)[0]
    _, same = nn.inference_mode(sn)(
        jnp.ones(3), jax.tree_util.tree_map(lambda a: a, state)
    )
    np.testing.assert_array_equal(same.get(sn.uv_index)[0], u0)
    _, moved = sn(jnp.ones(3), state)
    assert not np.allclose(moved.get(sn.uv_index)[0], u0)


def test_spectral_norm_3d_weight_grad_and_sequential(getkey, normal):
    layer = Tensor3(normal(2, 3, 4))
    sn_key = getkey()
    seq, state = nn.make_with_state(
        lambda: nn.Sequential(
            [
                nn.SpectralNorm(layer, "weight", num_power_iterations=2, key=sn_key),
                nn.Lambda(jnp.tanh),
            ]
        )
    )()
    u, v = state.get(seq[0].uv_index)
    assert (u.shape, v.shape) == ((2,), (12,))
    x = normal(3, 4)
    y, state = seq(x, state)
    assert y.shape == (2,)
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m(x, state)[0])))(seq)  # one program
    assert grads.layers[0].layer.weight.shape == (2, 3, 4)
    assert bool(np.isfinite(np.asarray(grads.layers[0].layer.weight)).all())


def test_spectral_norm_dtype(getkey):
    sn, state = nn.make_with_state(nn.SpectralNorm)(
        nn.Linear(3, 2, key=getkey()), "weight", dtype=jnp.bfloat16, key=getkey()
    )
    assert state.get(sn.uv_index)[0].dtype == jnp.bfloat16
    y, state = sn(jnp.ones(3), state)
    assert y.dtype == jnp.float32
    assert state.get(sn.uv_index)[1].dtype == jnp.bfloat16
    bf, state = nn.make_with_state(nn.SpectralNorm)(
        nn.Linear(3, 2, dtype=jnp.bfloat16, key=getkey()), "weight", key=getkey()
    )
    y, _ = bf(jnp.ones(3, jnp.bfloat16), state)
    assert y.dtype == jnp.bfloat16


def test_spectral_norm_errors(getkey):
    linear = nn.Linear(3, 2, key=getkey())
    with pytest.raises(ValueError, match="at least 2-dimensional, got shape \\(2,\\)"):
        nn.SpectralNorm(linear, "bias", key=getkey())
    with pytest.raises(
        ValueError,
        match="SpectralNorm: the wrapped Linear has no array attribute 'kernel'",
    ):
        nn.SpectralNorm(linear, "kernel", key=getkey())
    with pytest.raises(ValueError, match="`num_power_iterations` must be non-negative"):
        nn.SpectralNorm(linear, "weight", num_power_iterations=-1, key=getkey())


# --------------------------------------------------------------------------------- Shared


def make_pair(getkey):
    return nn.Linear(3, 3, key=getkey()), nn.Linear(3, 3, key=getkey())


def test_shared_ties_and_removes_duplicate(getkey):
    pair = make_pair(getkey)
    shared = nn.Shared(pair, lambda p: p[1].weight, lambda p: p[0].weight)
    assert len(jax.tree_util.tree_leaves(shared)) == 3  # w0, b0, b1
    first, second = shared()
    assert second.weight is first.weight
    assert repr(shared.pytree[1].weight) == "SharedNode()"


def test_shared_gradient_is_sum_of_uses(getkey, normal):
    pair = make_pair(getkey)
    x = normal(3)

    def loss_untied(pair):
        first, second = pair
        return jnp.sum(first(x)) + jnp.sum(second(x) ** 2)

    # Tie second.weight to first.weight: start from equal weights.
    tied_pair = boxwood.tree_at(lambda p: p[1].weight, pair, pair[0].weight)
    untied_grads = jax.grad(loss_untied)(tied_pair)
    shared = nn.Shared(pair, lambda p: p[1].weight, lambda p: p[0].weight)
    grads = jax.jit(jax.grad(lambda s: loss_untied(s())))(shared)
    np.testing.assert_allclose(
        grads.pytree[0].weight,
        untied_grads[0].weight + untied_grads[1].weight,
        rtol=1e-5,
    )
    np.testing.assert_allclose(grads.pytree[1].bias, untied_grads[1].bias, rtol=1e-5)


def test_shared_with_transpose_and_several_nodes(getkey):
    a, b = nn.Linear(3, 4, key=getkey()), nn.Linear(4, 3, key=getkey())
    shared = nn.Shared((a, b), lambda p: p[1].weight, lambda p: p[0].weight.T)
    np.testing.assert_array_equal(shared()[1].weight, a.weight.T)
    pair = make_pair(getkey)
    both = nn.Shared(
        pair,
        lambda p: (p[1].weight, p[1].bias),
        lambda p: (p[0].weight, p[0].bias),
    )
    first, second = both()
    x = jnp.ones(3)
    np.testing.assert_array_equal(first(x), second(x))
    assert len(jax.tree_util.tree_leaves(both)) == 2


def test_shared_structure_mismatch(getkey):
    pair = make_pair(getkey)
    with pytest.raises(
        ValueError,
        match=r"Every node being shared together \(`Shared`\) must have the same",
    ):
        nn.Shared(pair, lambda p: p[1].weight, lambda p: p[0].bias)
