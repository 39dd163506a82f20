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
