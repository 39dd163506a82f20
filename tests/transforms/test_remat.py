"""`filter_checkpoint`."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
from _precision import highest_matmul_precision  # noqa: F401

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


class Block(boxwood.Module):
    weight: jax.Array
    label: str
    activation: Callable = boxwood.field(static=True)

    def __call__(self, x):
        return self.activation(self.weight @ x), self.label


def _block(getkey):
    return Block(jr.normal(getkey(), (3, 3)), "block", jnp.sin)


def _loss(block, x):
    y, label = block(x)
    assert label == "block"
    return jnp.sum(y**2)


def test_same_values_and_non_array_outputs(getkey):
    block, x = _block(getkey), jr.normal(getkey(), (3,))
    y, label = boxwood.filter_checkpoint(lambda b, x: b(x))(block, x)
    np.testing.assert_allclose(y, block(x)[0], rtol=1e-6)
    assert label == "block"


def test_same_gradients(getkey):
    block, x = _block(getkey), jr.normal(getkey(), (3,))
    remat = boxwood.filter_checkpoint(_loss)
    got = boxwood.filter_grad(remat)(block, x)
    expected = boxwood.filter_grad(_loss)(block, x)
    np.testing.assert_allclose(got.weight, expected.weight, rtol=1e-5)
    assert got.label is None


def _remat_eqns(jaxpr):
    return [
        e
        for e in jaxpr.jaxpr.eqns
        if e.primitive.name.startswith(("remat", "checkpoint"))
    ]


def test_checkpoint_appears_in_the_jaxpr(getkey):
    block, x = _block(getkey), jr.normal(getkey(), (3,))
    remat = boxwood.filter_checkpoint(_loss)
    with_weight = lambda w: boxwood.tree_at(lambda b: b.weight, block, w)  # noqa: E731
    jaxpr = jax.make_jaxpr(lambda w: remat(with_weight(w), x))(block.weight)
    (eqn,) = _remat_eqns(jaxpr)
    assert eqn.params["prevent_cse"] is True and eqn.params["policy"] is None
    plain = jax.make_jaxpr(lambda w: _loss(with_weight(w), x))(block.weight)
    assert not _remat_eqns(plain)


def test_bound_method_differentiates_the_module(getkey):
    block, x = _block(getkey), jr.normal(getkey(), (3,))

    def loss(b, x):
        return jnp.sum(boxwood.filter_checkpoint(b.__call__)(x)[0] ** 2)

    got = boxwood.filter_grad(loss)(block, x)
    expected = boxwood.filter_grad(_loss)(block, x)
    np.testing.assert_allclose(got.weight, expected.weight, rtol=1e-5)


def test_decorator_with_policy_and_kwargs(getkey):
    x = jr.normal(getkey(), (3,))

    @boxwood.filter_checkpoint(
        policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=True
    )
    def f(x, *, power, name):
        assert name == "n"
        return jnp.sum(jnp.sin(x) ** power)

    grad = jax.grad(lambda x: f(x, power=3, name="n"))(x)
    (eqn,) = _remat_eqns(jax.make_jaxpr(lambda x: f(x, power=3, name="n"))(x))
    assert eqn.params["policy"] is jax.checkpoint_policies.nothing_saveable
    assert eqn.params["prevent_cse"] is True
    np.testing.assert_allclose(grad, 3 * jnp.sin(x) ** 2 * jnp.cos(x), rtol=1e-5)


def test_under_jit(getkey):
    block, x = _block(getkey), jr.normal(getkey(), (3,))
    f = boxwood.filter_jit(boxwood.filter_grad(boxwood.filter_checkpoint(_loss)))
    np.testing.assert_allclose(
        f(block, x).weight, boxwood.filter_grad(_loss)(block, x).weight, rtol=1e-5
    )


def test_prevent_cse_is_passed(getkey):
    f = boxwood.filter_checkpoint(jnp.sin, prevent_cse=False)
    (eqn,) = _remat_eqns(jax.make_jaxpr(f)(jnp.ones(2)))
    assert eqn.params["prevent_cse"] is False


def _counting(traces):
    def body(x, flag):
        traces.append(flag)
        y = jnp.sin(x) if flag is True else jnp.cos(x)
        return y * 2.0, {"flag": flag}

    return boxwood.filter_checkpoint(body)


def test_calls_alike_are_traced_once():
    # one wrapper called again with the same static parts and array types is
    # traced once (its jaxpr then differentiated and batched once too): a loop
    # of identical layers costs one layer's trace
    traces = []
    body = _counting(traces)

    def loss(x):
        total = 0.0
        for _ in range(4):
            y, aux = body(x, True)
            assert aux == {"flag": True}
            total = total + jnp.sum(y)
            x = x + 1.0
        return total

    x = jnp.linspace(0.0, 1.0, 3)
    value, grad = jax.value_and_grad(loss)(x)
    assert len(traces) == 1
    steps = [x + i for i in range(4)]
    np.testing.assert_allclose(value, sum(jnp.sum(2 * jnp.sin(s)) for s in steps), 1e-6)
    np.testing.assert_allclose(grad, sum(2 * jnp.cos(s) for s in steps), 1e-6)


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return True


def test_calls_that_differ_are_traced_apart():
    traces = []
    body = _counting(traces)
    unhashable = _Unhashable()  # kept by identity

    @boxwood.filter_jit
    def calls(x):
        return [
            body(x, True),
            body(x, 1),  # True == 1, but the body tells them apart
            body(jnp.ones(4) * x[0], True),  # another shape
            body(x.astype(jnp.float16), True),  # another dtype
            body(x, 0.0),
            body(x, -0.0),  # equal, but another program (1 / -0.0 is -inf)
            body(x, 0.0),
            body(x, unhashable),
            body(x, unhashable),
            body(x, _Unhashable()),
        ]

    x = jnp.ones(3)
    (sin, aux), (cos, aux_one), *_ = calls(x)
    np.testing.assert_allclose(sin, 2 * jnp.sin(x))
    np.testing.assert_allclose(cos, 2 * jnp.cos(x))
    assert aux["flag"] is True and type(aux_one["flag"]) is int
    assert traces[:6] == [True, 1, True, True, 0.0, -0.0] and str(traces[5]) == "-0.0"
    assert len(traces) == 8


def test_a_global_rebound_between_calls_is_read_again():
    # calls in different traces (or eager ones) share nothing: a notebook's
    # rebound global is seen by the next call, eager, differentiated or compiled
    # (by `filter_jit`; a plain `jax.jit` keeps its own trace)
    global _SCALE
    body = boxwood.filter_checkpoint(lambda x: x * _SCALE)
    grad = jax.grad(lambda x: jnp.sum(body(x)))
    compiled = boxwood.filter_jit(lambda x: grad(x))
    x = jnp.ones(2)
    try:
        for scale in (2.0, 3.0):
            _SCALE = scale
            np.testing.assert_allclose(body(x), [scale, scale])
            np.testing.assert_allclose(grad(x), [scale, scale])
            np.testing.assert_allclose(compiled(x), [scale, scale])
    finally:
        _SCALE = 1.0


_SCALE = 1.0


def test_a_wrapper_collected_takes_its_functions_with_it():
    import gc
    import operator
    import pickle

    from boxwood._transforms import _checkpoint

    def traced_call(w):  # a call under a trace: its function is kept
        return jax.grad(lambda x: jnp.sum(w(x)))(jnp.ones(2))

    wrapper = boxwood.filter_checkpoint(operator.neg)
    traced_call(wrapper)
    key = id(wrapper)
    assert key in _checkpoint._FUNCTIONS
    assert pickle.loads(pickle.dumps(wrapper))(jnp.ones(1)) == -1.0  # still picklable
    boxwood.clear_caches()  # emptied with boxwood's other caches
    assert key not in _checkpoint._FUNCTIONS
    np.testing.assert_allclose(traced_call(wrapper), [-1.0, -1.0])
    assert key in _checkpoint._FUNCTIONS
    del wrapper
    gc.collect()
    assert key not in _checkpoint._FUNCTIONS


def test_an_unrolled_stack_traces_its_layer_once():
    traces = []

    def layer_step(layer, carry, _):
        traces.append(None)
        return layer(carry), None

    stack = boxwood.nn.Stacked(
        lambda k: boxwood.nn.Linear(3, 3, key=k), 4, key=jr.key(0), remat=True
    )
    x = jnp.ones(3)
    for unroll in (True, 1):
        traces.clear()
        grad = jax.grad(lambda s: jnp.sum(s.scan(layer_step, x)[0]))
        grad(stack.with_unroll(unroll))
        assert len(traces) == 1, unroll
