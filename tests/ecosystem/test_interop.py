"""Equinox modules inside boxwood modules and the reverse."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

import boxwood as bw


class BwLinear(bw.Module):
    weight: jax.Array
    activation: Callable = bw.field(static=True, default=jnp.tanh)

    def __call__(self, x):
        return self.activation(self.weight @ x)


class EqxLinear(eqx.Module):
    weight: jax.Array
    scale: float = eqx.field(static=True, default=2.0)

    def __call__(self, x):
        return self.scale * (self.weight @ x)


class BwHoldsEqx(bw.Module):
    inner: EqxLinear
    outer: BwLinear

    def __call__(self, x):
        return self.outer(self.inner(x))


class EqxHoldsBw(eqx.Module):
    inner: BwLinear
    outer: EqxLinear

    def __call__(self, x):
        return self.outer(self.inner(x))


def _check_roundtrip(model):
    leaves, treedef = jax.tree_util.tree_flatten(model)
    assert len(leaves) == 2
    rebuilt = treedef.unflatten(leaves)
    assert type(rebuilt) is type(model) and bw.tree_equal(rebuilt, model)
    doubled = jax.tree_util.tree_map(lambda a: 2 * a, model)
    assert type(doubled.inner) is type(model.inner)
    assert jnp.allclose(doubled.inner.weight, 2 * model.inner.weight)
    x = jnp.ones(2)
    assert jnp.allclose(bw.filter_jit(lambda m, x: m(x))(model, x), model(x))
    assert jnp.allclose(eqx.filter_jit(lambda m, x: m(x))(model, x), model(x))
    grads = bw.filter_grad(lambda m: jnp.sum(m(x)))(model)
    assert type(grads) is type(model) and grads.inner.weight.shape == (2, 2)
    return treedef


def test_equinox_inside_boxwood():
    model = BwHoldsEqx(EqxLinear(jnp.eye(2)), BwLinear(jnp.eye(2) * 0.5))
    treedef = _check_roundtrip(model)
    # the Equinox module's static field is part of the structure
    other = BwHoldsEqx(EqxLinear(jnp.eye(2), 3.0), BwLinear(jnp.eye(2)))
    assert jax.tree_util.tree_structure(other) != treedef


def test_boxwood_inside_equinox():
    model = EqxHoldsBw(BwLinear(jnp.eye(2)), EqxLinear(jnp.eye(2)))
    treedef = _check_roundtrip(model)
    other = EqxHoldsBw(BwLinear(jnp.eye(2), jax.nn.relu), EqxLinear(jnp.eye(2)))
    assert jax.tree_util.tree_structure(other) != treedef


def test_partition_combine_across_libraries():
    model = EqxHoldsBw(BwLinear(jnp.eye(2)), EqxLinear(jnp.eye(2)))
    dyn, static = bw.partition(model, bw.is_array)
    assert bw.tree_equal(bw.combine(dyn, static), model)
    edyn, estatic = eqx.partition(model, eqx.is_array)
    assert bw.tree_equal(eqx.combine(edyn, estatic), model)


def test_tree_at_across_libraries():
    model = BwHoldsEqx(EqxLinear(jnp.eye(2)), BwLinear(jnp.eye(2)))
    new = bw.tree_at(lambda m: m.inner.weight, model, jnp.zeros((2, 2)))
    assert jnp.all(new.inner.weight == 0) and new.inner.scale == 2.0
    new2 = eqx.tree_at(lambda m: m.outer.weight, model, jnp.zeros((2, 2)))
    assert jnp.all(new2.outer.weight == 0) and new2.outer.activation is jnp.tanh


def test_equinox_code_runs_with_boxwood_as_eqx():
    import boxwood as eqx_alias

    class Model(eqx_alias.Module):
        layers: list

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.layers = [
                eqx_alias.nn.Linear(3, 4, key=k1),
                eqx_alias.nn.Linear(4, 1, key=k2),
            ]

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    model = Model(jax.random.key(0))
    x = jnp.ones((8, 3))

    @eqx_alias.filter_jit
    def loss(model, x):
        return jnp.mean(jax.vmap(model)(x) ** 2)

    grads = eqx_alias.filter_grad(loss)(model, x)
    model = eqx_alias.apply_updates(
        model, jax.tree_util.tree_map(lambda g: -0.1 * g, grads)
    )
    assert jnp.isfinite(loss(model, x))
