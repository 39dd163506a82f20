"""Modules whose leaves are not all arrays (a function in an ordinary field, as
Equinox code writes `activation: Callable`; a `filter_grad` wrapper, whose one leaf
is the function it wraps; a number) take `filter_jit`'s fast path like any other:
their flat form's token stands for the structure *and* those leaves, so a warm
call does not flatten its arguments, and a different value recompiles."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
import pytest

import boxwood as bw
from boxwood import nn
from boxwood._module import _flat_key


class Dense(bw.Module):
    weight: jax.Array
    activation: Callable  # an ordinary field holding a function, as in Equinox code
    scale: float

    def __init__(self, n, activation=jax.nn.relu, scale=1.0, *, key):
        self.weight = jax.random.normal(key, (n, n))
        self.activation = activation
        self.scale = scale

    def __call__(self, x):
        return self.activation(self.weight @ x) * self.scale


class Net(bw.Module):
    layers: tuple

    def __init__(self, key):
        k1, k2 = bw.random.split_keys(key)
        self.layers = (Dense(4, key=k1), Dense(4, jnp.tanh, 0.5, key=k2))

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _warm(f, *args, calls=3):
    for _ in range(calls):
        out = f(*args)
    return out


def test_module_with_a_function_leaf_is_walked(request):
    net = Net(jax.random.key(0))

    @bw.filter_jit
    def f(net, x):
        return net(x)

    x = jnp.ones(4)
    expected = _warm(f, net, x)
    flattens = request.getfixturevalue("count_flattens")
    for _ in range(5):
        assert (f(net, x) == expected).all()
    assert flattens["n"] == 0
    assert f.cache_info().traces == 1


def test_a_grad_wrapper_passed_as_an_argument_is_walked(request):
    grad_fn = bw.filter_value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))

    @bw.filter_jit
    def f(grad_fn, model, x):
        return grad_fn(model, x)

    model = nn.Linear(3, 2, key=jax.random.key(0))
    x = jnp.ones(3)
    value, _ = _warm(f, grad_fn, model, x)
    flattens = request.getfixturevalue("count_flattens")
    for _ in range(5):
        assert f(grad_fn, model, x)[0] == value
    assert flattens["n"] == 0


@jax.numpy_dtype_promotion("standard")  # optax's adam mixes int32 and float
def test_a_training_loop_over_such_a_model_flattens_nothing(request):
    tx = optax.sgd(0.1)
    net = Net(jax.random.key(1))

    @bw.filter_jit
    def step(net, opt_state, x):
        loss, grads = bw.filter_value_and_grad(lambda n: jnp.sum(n(x) ** 2))(net)
        updates, opt_state = tx.update(grads, opt_state)
        return bw.apply_updates(net, updates), opt_state, loss

    opt_state = tx.init(bw.filter(net, bw.is_inexact_array))
    x = jnp.ones(4)
    for _ in range(3):
        net, opt_state, _ = step(net, opt_state, x)
    flattens = request.getfixturevalue("count_flattens")
    losses = []
    for _ in range(5):
        net, opt_state, loss = step(net, opt_state, x)
        losses.append(float(loss))
    assert flattens["n"] == 0
    assert losses == sorted(losses, reverse=True)
    assert step.cache_info().traces == 1
    # the returned model is whole: its static leaves are the ones passed in
    assert net.layers[1].activation is jnp.tanh and net.layers[1].scale == 0.5
    assert net.layers[0].activation is jax.nn.relu


def test_a_different_static_leaf_recompiles_on_the_fast_path():
    @bw.filter_jit
    def f(layer, x):
        return layer(x)

    key = jax.random.key(2)
    x = jnp.arange(4.0) - 2.0
    relu = Dense(4, jax.nn.relu, key=key)
    tanh = Dense(4, jnp.tanh, key=key)
    for _ in range(3):
        assert (f(relu, x) == relu(x)).all()
        assert (f(tanh, x) == tanh(x)).all()
    assert f.cache_info().traces == 2
    # equal numbers of another type or sign are different programs (as for fields
    # declared static): 1 and 1.0, 0.0 and -0.0
    outs = {}
    for scale in (1, 1.0, 0.0, -0.0):
        layer = Dense(4, jax.nn.relu, scale, key=key)
        for _ in range(3):
            out = f(layer, x)
        outs[repr(scale)] = out
        assert out.dtype == layer(x).dtype
    assert f.cache_info().traces == 5  # scale=1.0 is `relu`'s own program
    assert (1 / outs["0.0"] == 1 / jnp.zeros(4)).all()
    assert (1 / outs["-0.0"] == 1 / -jnp.zeros(4)).all()


def test_equal_modules_share_a_token_and_a_different_leaf_does_not():
    key = jax.random.key(3)
    a = Dense(4, jax.nn.relu, 2.0, key=key)
    b = Dense(4, jax.nn.relu, 2.0, key=key)
    c = Dense(4, jnp.tanh, 2.0, key=key)
    ra, rb, rc = (_flat_key.remember(m) for m in (a, b, c))
    assert ra is not None and rb is not None and rc is not None
    assert ra[0] is rb[0] and ra[0] is not rc[0]
    assert [type(x) for x in ra[1]] == [type(a.weight)]  # the arrays alone


def test_unhashable_or_numpy_leaves_get_no_flat_form():
    import numpy as np

    class Holder(bw.Module):
        weight: jax.Array
        extra: object

    class Unhashable:
        __hash__ = None

    w = jnp.ones(2)
    assert _flat_key.remember(Holder(w, Unhashable())) is None
    assert _flat_key.remember(Holder(w, np.ones(2))) is None
    assert _flat_key.remember(Holder(w, np.float32(1.0))) is None


def test_unhashable_leaf_still_raises_the_named_error():
    class Holder(bw.Module):
        weight: jax.Array
        extra: object

    class Unhashable:
        __hash__ = None

    @bw.filter_jit
    def f(h):
        return h.weight

    with pytest.raises(TypeError, match=r"args\[0\]\.extra"):
        f(Holder(jnp.ones(2), Unhashable()))


def test_lazy_outputs_with_static_leaves_read_their_fields():
    @bw.filter_jit
    def f(layer):
        return bw.tree_at(lambda m: m.weight, layer, layer.weight + 1)

    layer = Dense(4, jnp.tanh, 3.0, key=jax.random.key(4))
    out = _warm(f, layer)
    # a fresh output (built from its flat form) materialises its fields correctly
    fresh = f(layer)
    assert fresh.activation is jnp.tanh and fresh.scale == 3.0
    assert (fresh.weight == layer.weight + 1).all()
    assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(layer)
    assert bw.tree_equal(out, fresh)
