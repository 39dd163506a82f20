import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn


@pytest.fixture
def normal():
    """`normal(*shape)`: standard normal float32 inputs (NumPy-generated, so that
    tests do not compile a random-number kernel per shape)."""
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


class AddNoise(boxwood.Module):
    """Adds `normal(key)`: shows which key a layer received."""

    def __call__(self, x, *, key=None):
        return x + jr.normal(key, x.shape)


class NoKey(boxwood.Module):
    """A layer whose `__call__` takes no key."""

    def __call__(self, x):
        return 2 * x


def test_lambdas_in_order():
    seq = nn.Sequential([nn.Lambda(lambda x: x + 1), nn.Lambda(lambda x: 3 * x)])
    np.testing.assert_allclose(seq(jnp.array([1.0, 2.0])), [6.0, 9.0])
    assert not seq.is_stateful()


def test_lambda_fn_is_static_and_checked():
    lam = nn.Lambda(jax.nn.relu)
    assert jax.tree_util.tree_leaves(lam) == []
    assert lam.fn.fn is jax.nn.relu
    assert jax.jit(lambda f, x: f(x))(lam, jnp.array([-1.0])) == 0
    with pytest.raises(TypeError, match="`fn` must be callable"):
        nn.Lambda(3)


def scale(w, x):
    return w * x


def test_lambda_of_a_partial_holds_its_arrays():
    w = jnp.array([2.0, 3.0])
    lam = nn.Lambda(boxwood.Partial(scale, w))
    leaves = jax.tree_util.tree_leaves(lam)
    assert any(leaf is w for leaf in leaves)
    x = jnp.array([1.0, 1.0])
    np.testing.assert_array_equal(lam(x), w)
    grads = boxwood.filter_grad(lambda m: jnp.sum(m(x) ** 2))(lam)
    np.testing.assert_array_equal(grads.fn.args[0], 2 * w)
    np.testing.assert_array_equal(boxwood.filter_jit(lambda m: m(x))(lam), w)


def test_key_split_across_layers_and_only_to_layers_taking_it(getkey, normal):
    key = getkey()
    seq = nn.Sequential([AddNoise(), NoKey(), AddNoise()])
    x = jnp.zeros(3)
    k0, _, k2 = jr.split(key, 3)
    expected = 2 * jr.normal(k0, (3,)) + jr.normal(k2, (3,))
    np.testing.assert_allclose(seq(x, key=key), expected, rtol=1e-6)


def test_no_key_given_passes_none(getkey):
    seq = nn.Sequential([NoKey(), nn.Lambda(jnp.sin)])
    np.testing.assert_allclose(seq(jnp.ones(2)), jnp.sin(2 * jnp.ones(2)))


def make_bn_model():
    return nn.Sequential(
        [
            nn.Lambda(lambda x: x * 2.0),
            nn.BatchNorm(3, axis_name="batch", momentum=0.5),
            nn.Lambda(jax.nn.relu),
        ]
    )


def test_state_threads_through_stateful_member(normal):
    model, state = nn.make_with_state(make_bn_model)()
    assert model.is_stateful()
    bn = model[1]
    x = normal(8, 3) + 5.0
    batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    y, state = batched(x, state)
    assert y.shape == (8, 3)
    assert float(jnp.min(y)) >= 0.0  # the ReLU ran
    mean, var = state.get(bn.state_index)
    np.testing.assert_allclose(mean, 0.5 * jnp.mean(2 * x, axis=0), rtol=1e-5)
    np.testing.assert_allclose(
        var, 0.5 + 0.5 * jnp.var(2 * x, axis=0, ddof=1), rtol=1e-5
    )


def test_stateful_sequential_under_jit(normal):
    model, state = nn.make_with_state(make_bn_model)()
    step = jax.jit(
        jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    )
    x = normal(4, 3)
    for _ in range(2):
        y, state = step(x, state)
    mean = state.get(model[1].state_index)[0]
    np.testing.assert_allclose(mean, 0.75 * jnp.mean(2 * x, axis=0), rtol=1e-5)


def test_stateful_member_without_state_errors():
    model, _ = nn.make_with_state(make_bn_model)()
    with pytest.raises(ValueError, match=r"layer 1 \(BatchNorm\) is stateful"):
        jax.vmap(model, axis_name="batch")(jnp.ones((2, 3)))


def test_nested_sequential_is_stateful():
    inner, _ = nn.make_with_state(make_bn_model)()
    outer = nn.Sequential([nn.Lambda(jnp.tanh), inner])
    assert outer.is_stateful()
    assert not nn.Sequential([nn.Lambda(jnp.tanh)]).is_stateful()


def test_indexing_len_iter():
    layers = [nn.Lambda(jnp.sin), nn.Lambda(jnp.cos), nn.Lambda(jnp.tanh)]
    seq = nn.Sequential(layers)
    assert len(seq) == 3
    assert seq[1] is seq.layers[1]
    assert isinstance(seq[1:], nn.Sequential) and len(seq[1:]) == 2
    assert list(seq) == list(seq.layers)
    with pytest.raises(TypeError, match="ints or slices"):
        seq["a"]


def test_jit_whole_model(getkey):
    seq = nn.Sequential([nn.Linear(3, 4, key=getkey()), nn.Lambda(jax.nn.relu)])
    x = jnp.ones(3)
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(seq, x), seq(x), rtol=1e-6)
    np.testing.assert_allclose(boxwood.filter_jit(seq)(x), seq(x), rtol=1e-6)
    grads = jax.grad(lambda m: jnp.sum(m(x)))(seq)
    assert grads.layers[0].weight.shape == (4, 3)
