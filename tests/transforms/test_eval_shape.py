"""`filter_eval_shape`."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.random as jr

import boxwood


class Model(boxwood.Module):
    weight: jax.Array
    depth: int
    activation: Callable = boxwood.field(static=True)

    def __init__(self, size, *, key):
        self.weight = jr.normal(key, (size, size))
        self.depth = 2
        self.activation = jnp.tanh

    def __call__(self, x):
        return self.activation(self.weight @ x)


def test_arrays_become_shape_dtype_structs_and_non_arrays_pass_through():
    def f(x, n, *, tag):
        assert isinstance(n, int) and tag == "t"
        return {"y": jnp.sum(x, axis=0) * n, "i": x.astype(jnp.int32), "tag": tag}

    out = boxwood.filter_eval_shape(f, jnp.ones((4, 3)), 2, tag="t")
    assert out["y"] == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert out["i"] == jax.ShapeDtypeStruct((4, 3), jnp.int32)
    assert out["tag"] == "t"


def test_matches_jax_eval_shape_on_array_functions():
    f = lambda x, y: (x @ y, jnp.concatenate([x, x]))  # noqa: E731
    x, y = jnp.ones((2, 3)), jnp.ones((3, 5))
    assert boxwood.filter_eval_shape(f, x, y) == jax.eval_shape(f, x, y)


def test_model_construction_without_allocation(getkey):
    key = getkey()
    model = boxwood.filter_eval_shape(lambda k: Model(1000, key=k), key)
    assert isinstance(model, Model)
    assert model.weight == jax.ShapeDtypeStruct((1000, 1000), jnp.float32)
    assert model.depth == 2 and model.activation is jnp.tanh


def test_inputs_may_be_shape_dtype_structs_and_module_functions(getkey):
    model = Model(3, key=getkey())
    x = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert boxwood.filter_eval_shape(model, x) == jax.ShapeDtypeStruct(
        (3,), jnp.float32
    )


def test_nothing_is_computed():
    seen = []

    def f(x):
        seen.append(type(x))
        return x + 1

    boxwood.filter_eval_shape(f, jnp.ones(2))
    assert len(seen) == 1 and issubclass(seen[0], jax.core.Tracer)
