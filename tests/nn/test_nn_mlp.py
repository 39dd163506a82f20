import copy
import pickle

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _precision import tolerance


def _reference(mlp, x, activation=jax.nn.relu, final=lambda y: y):
    *hidden, last = mlp.layers
    for layer in hidden:
        x = activation(layer.weight @ x + layer.bias)
    return final(last.weight @ x + last.bias)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_structure_and_output(getkey, depth):
    mlp = nn.MLP(3, 2, width_size=5, depth=depth, key=getkey())
    assert len(mlp.layers) == depth + 1
    sizes = [(layer.in_features, layer.out_features) for layer in mlp.layers]
    if depth == 0:
        assert sizes == [(3, 2)]
    else:
        assert sizes == [(3, 5)] + [(5, 5)] * (depth - 1) + [(5, 2)]
    x = jr.normal(getkey(), (3,))
    np.testing.assert_allclose(mlp(x), _reference(mlp, x), rtol=1e-5, atol=1e-6)


def test_activations_and_biases(getkey):
    mlp = nn.MLP(
        3,
        2,
        4,
        2,
        activation=jax.nn.tanh,
        final_activation=jax.nn.sigmoid,
        use_bias=False,
        use_final_bias=True,
        key=getkey(),
    )
    assert [layer.bias is None for layer in mlp.layers] == [True, True, False]
    x = jr.normal(getkey(), (3,))
    h = jnp.tanh(mlp.layers[1].weight @ jnp.tanh(mlp.layers[0].weight @ x))
    expected = jax.nn.sigmoid(mlp.layers[2].weight @ h + mlp.layers[2].bias)
    np.testing.assert_allclose(mlp(x), expected, rtol=1e-5)


def test_scalar_sizes(getkey):
    mlp = nn.MLP("scalar", "scalar", 4, 2, key=getkey())
    assert mlp(jnp.float32(0.5)).shape == ()
    assert jax.vmap(mlp)(jnp.linspace(0, 1, 7)).shape == (7,)


def test_scan_matches_loop(getkey):
    key = getkey()
    loop = nn.MLP(3, 2, 6, 4, key=key)
    scanned = nn.MLP(3, 2, 6, 4, scan=True, key=key)
    assert len(scanned.layers) == 3
    assert scanned.layers[1].weight.shape == (3, 6, 6)
    np.testing.assert_allclose(scanned.layers[1].weight[1], loop.layers[2].weight)
    x = jr.normal(getkey(), (3,))
    np.testing.assert_allclose(scanned(x), loop(x), rtol=1e-5, atol=1e-6)


def test_static_config_jit_vmap(getkey):
    mlp = nn.MLP(3, 2, 4, 2, activation=jax.nn.gelu, key=getkey())
    leaves = jax.tree_util.tree_leaves(mlp)
    assert len(leaves) == 6 and all(boxwood.is_array(leaf) for leaf in leaves)
    xs = jr.normal(getkey(), (5, 3))
    out = jax.jit(lambda m, xs: jax.vmap(m)(xs))(mlp, xs)
    assert out.shape == (5, 2)
    # (a TPU's batched products and GELU differ from the single ones in a few ulps)
    np.testing.assert_allclose(
        out[1],
        mlp(xs[1]),
        rtol=tolerance(cpu=1e-5, accelerator=1e-4),
        atol=tolerance(cpu=1e-6, accelerator=1e-5),
    )
    # Two default MLPs share a treedef (the default activations are the same objects).
    other = nn.MLP(3, 2, 4, 2, activation=jax.nn.gelu, key=getkey())
    assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(mlp)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision(getkey, dtype):
    mlp = nn.MLP(3, 2, 4, 2, dtype=dtype, key=getkey())
    assert all(leaf.dtype == dtype for leaf in jax.tree_util.tree_leaves(mlp))
    y = mlp(jnp.ones(3, dtype))
    assert y.dtype == dtype and np.isfinite(np.asarray(y)).all()


def test_errors(getkey):
    mlp = nn.MLP(3, 2, 4, 2, key=getkey())
    with pytest.raises(
        ValueError,
        match=r"MLP\(in_size=3, out_size=2\): expected input of shape \(3,\), got \(4,\)",
    ):
        mlp(jnp.ones(4))
    with pytest.raises(ValueError, match="`depth` must be a non-negative int"):
        nn.MLP(3, 2, 4, -1, key=getkey())
    with pytest.raises(TypeError, match="`activation` must be callable"):
        nn.MLP(3, 2, 4, 1, activation="relu", key=getkey())
    with pytest.raises(TypeError, match="`final_activation` is a plain callable"):
        nn.MLP(3, 2, 4, 1, final_activation=Unhashable(), key=getkey())


class Unhashable:
    __hash__ = None

    def __call__(self, x):
        return x


def reference_prelu_mlp(mlp, x):
    """The MLP by hand: hidden layer i uses slopes `activation.negative_slope[i]`
    (one per neuron), the output layer `final_activation.negative_slope`."""
    slopes = mlp.activation.negative_slope
    for i, layer in enumerate(mlp.layers[:-1]):
        h = layer.weight @ x + layer.bias
        x = jnp.where(h > 0, h, slopes[i] * h)
    h = mlp.layers[-1].weight @ x + mlp.layers[-1].bias
    return jnp.where(h > 0, h, mlp.final_activation.negative_slope * h)


@pytest.mark.parametrize("scan", [False, True])
def test_learnable_activation_has_a_copy_per_neuron(getkey, scan):
    mlp = nn.MLP(3, 2, 4, 3, nn.PReLU(0.1), nn.PReLU(0.3), scan=scan, key=getkey())
    assert mlp.activation.negative_slope.shape == (3, 4)
    assert mlp.final_activation.negative_slope.shape == (2,)
    # Give every neuron a different slope, so that mixing them up would show.
    slopes = jr.uniform(getkey(), (3, 4), minval=0.05, maxval=0.9)
    mlp = boxwood.tree_at(lambda m: m.activation.negative_slope, mlp, slopes)
    x = jr.normal(getkey(), (3,)) * 3
    if not scan:  # (with scan, `layers` holds the hidden layers stacked)
        np.testing.assert_allclose(mlp(x), reference_prelu_mlp(mlp, x), rtol=1e-5)
    # The slopes are trained: they get gradients, neuron by neuron. (Jitted: one
    # program, not one per operation of the backward pass.)
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m(x) ** 2)))(mlp)
    assert grads.activation.negative_slope.shape == (3, 4)
    assert (np.asarray(grads.activation.negative_slope) != 0).any()
    # jax.jit of the whole model works (its leaves are all arrays).
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(mlp, x), mlp(x), rtol=1e-5)


def test_scan_and_unrolled_learnable_activations_agree(getkey):
    key = getkey()
    loop = nn.MLP(3, 2, 4, 3, nn.PReLU(), key=key)
    scan = nn.MLP(3, 2, 4, 3, nn.PReLU(), scan=True, key=key)
    slopes = jr.uniform(getkey(), (3, 4))
    loop = boxwood.tree_at(lambda m: m.activation.negative_slope, loop, slopes)
    scan = boxwood.tree_at(lambda m: m.activation.negative_slope, scan, slopes)
    x = jr.normal(getkey(), (3,)) * 3
    np.testing.assert_allclose(scan(x), loop(x), rtol=1e-5, atol=1e-6)


def test_plain_activations_are_static(getkey):
    mlp = nn.MLP(3, "scalar", 4, 2, jnp.tanh, key=getkey())
    assert isinstance(mlp.activation, nn.StaticFunction)
    assert mlp.activation.fn is jnp.tanh
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(mlp))
    assert jax.jit(lambda m, x: m(x))(mlp, jnp.ones(3)).shape == ()


def test_default_activations_pickle_and_deep_copy_to_equal_models(getkey):
    mlp = nn.MLP(2, 1, width_size=4, depth=1, key=getkey())  # jax.nn.relu
    for clone in (pickle.loads(pickle.dumps(mlp)), copy.deepcopy(mlp)):
        assert clone == mlp
        assert jax.tree_util.tree_structure(clone) == jax.tree_util.tree_structure(mlp)
    # also a jitted function (jnp.tanh) held by name
    tanh = nn.Lambda(jnp.tanh)
    assert pickle.loads(pickle.dumps(tanh)) == tanh == copy.deepcopy(tanh)
