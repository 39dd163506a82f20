"""`filter_pure_callback`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood


def _host(x, scale, *, label):
    assert boxwood.is_array(x) and isinstance(scale, int)
    return {"y": np.sort(np.asarray(x)) * scale, "label": label}


_OUT = {"y": jax.ShapeDtypeStruct((3,), jnp.float32), "label": "sorted"}


def test_result_under_jit():
    @jax.jit
    def f(x):
        out = boxwood.filter_pure_callback(
            _host, x, 2, label="sorted", result_shape_dtypes=_OUT
        )
        assert out["label"] == "sorted"
        return out["y"]

    np.testing.assert_allclose(f(jnp.array([3.0, 1.0, 2.0])), [2.0, 4.0, 6.0])


def test_eager_and_python_scalar_outputs():
    out = boxwood.filter_pure_callback(
        lambda x: (x.sum(), 1.5),
        jnp.arange(3.0),
        result_shape_dtypes=(
            jax.ShapeDtypeStruct((), jnp.float32),
            jax.ShapeDtypeStruct((), jnp.float32),
        ),
    )
    np.testing.assert_allclose(out[0], 3.0)
    assert out[1].dtype == jnp.float32 and float(out[1]) == 1.5


def test_under_vmap_with_vmap_method():
    def f(x):
        return boxwood.filter_pure_callback(
            _host,
            x,
            1,
            label="sorted",
            result_shape_dtypes=_OUT,
            vmap_method="sequential",
        )["y"]

    xs = jnp.array([[3.0, 1.0, 2.0], [0.0, -1.0, 5.0]])
    np.testing.assert_allclose(jax.vmap(f)(xs), np.sort(np.asarray(xs), axis=1))


def test_mismatched_static_output_is_an_error():
    with pytest.raises(
        jax.errors.JaxRuntimeError, match=r"returned str 'other' at `output\['label'\]`"
    ):
        jax.block_until_ready(
            boxwood.filter_pure_callback(
                _host, jnp.ones(3), 1, label="other", result_shape_dtypes=_OUT
            )
        )


def test_mismatched_structure_is_an_error():
    with pytest.raises(
        jax.errors.JaxRuntimeError, match="returned an output of structure"
    ):
        jax.block_until_ready(
            boxwood.filter_pure_callback(
                lambda x: [x], jnp.ones(3), result_shape_dtypes=_OUT
            )
        )
