"""`filter_make_jaxpr`."""

import jax
import jax.numpy as jnp
import numpy as np

import boxwood


def test_jaxpr_shapes_and_static_outputs():
    def f(x, n, *, y, name):
        return {"out": jnp.sin(x) * n + y, "name": name, "count": n}

    x, y = jnp.arange(3.0), jnp.ones(3)
    jaxpr, shapes, static = boxwood.filter_make_jaxpr(f)(x, 2.0, y=y, name="f")
    assert len(jaxpr.jaxpr.invars) == 2  # only the arrays are inputs
    assert shapes == {
        "out": jax.ShapeDtypeStruct((3,), jnp.float32),
        "name": None,
        "count": None,
    }
    assert static == {"out": None, "name": "f", "count": 2.0}
    (result,) = jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, x, y)
    np.testing.assert_allclose(result, f(x, 2.0, y=y, name="f")["out"], rtol=1e-6)


def test_shape_dtype_struct_inputs():
    jaxpr, shapes, static = boxwood.filter_make_jaxpr(lambda a: (a.T, "t"))(
        jax.ShapeDtypeStruct((2, 5), jnp.int32)
    )
    assert shapes == (jax.ShapeDtypeStruct((5, 2), jnp.int32), None)
    assert static == (None, "t")
    assert jaxpr.jaxpr.invars[0].aval.shape == (2, 5)


def test_matches_jax_make_jaxpr_on_array_functions():
    f = lambda a, b: a * b + 1.0  # noqa: E731
    a, b = jnp.ones(2), jnp.ones(2)
    jaxpr, _, _ = boxwood.filter_make_jaxpr(f)(a, b)
    assert str(jaxpr) == str(jax.make_jaxpr(f)(a, b))
