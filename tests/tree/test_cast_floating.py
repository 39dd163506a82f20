"""`boxwood.cast_floating`: floating-point arrays cast, everything else untouched,
gradients back in the master dtype, and the compute in the cast dtype."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood as bw
from _jaxprs import all_equations
from boxwood import nn


def test_casts_floating_arrays_only(getkey):
    key = getkey()
    tree = {
        "w": jnp.ones((2, 3)),
        "half": jnp.ones(2, jnp.float16),
        "ids": jnp.arange(3),
        "flag": jnp.array([True]),
        "z": jnp.ones(2, jnp.complex64),
        "key": key,
        "raw_key": jr.PRNGKey(0),
        "host": np.ones(2, np.float64),
        "scalar": 1.5,
        "name": "layer",
    }
    out = bw.cast_floating(tree, jnp.bfloat16)
    assert out["w"].dtype == out["half"].dtype == jnp.bfloat16
    assert isinstance(out["host"], np.ndarray) and out["host"].dtype == jnp.bfloat16
    for name in ("ids", "flag", "z", "key", "raw_key", "scalar", "name"):
        assert out[name] is tree[name], name
    assert jax.tree.structure(out) == jax.tree.structure(tree)


def test_module_fields_and_statics(getkey):
    mlp = nn.MLP(3, 2, 4, 2, key=getkey())
    low = bw.cast_floating(mlp, jnp.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(low)} == {jnp.dtype(jnp.bfloat16)}
    assert bw.tree_equal(low.activation, mlp.activation) and low.width_size == 4
    back = bw.cast_floating(low, "float32")
    assert {x.dtype for x in jax.tree.leaves(back)} == {jnp.dtype(jnp.float32)}


def test_same_dtype_is_returned_as_is():
    w = jnp.ones(3)
    assert bw.cast_floating({"w": w}, jnp.float32)["w"] is w


def test_gradient_of_the_master_is_float32(getkey):
    mlp = nn.MLP(3, 2, 8, 2, key=getkey())
    x = jr.normal(getkey(), (3,))

    # one compiled program (eagerly, each operation of the bfloat16 forward and
    # backward pass compiles on its own)
    @bw.filter_jit
    @bw.filter_grad
    def grads(model):
        out = bw.cast_floating(model, jnp.bfloat16)(x.astype(jnp.bfloat16))
        return jnp.sum(out.astype(jnp.float32) ** 2)

    g = grads(mlp)
    leaves = jax.tree.leaves(g)
    assert leaves and {x.dtype for x in leaves} == {jnp.dtype(jnp.float32)}
    assert any(np.any(np.asarray(x) != 0) for x in leaves)


def test_matmuls_run_in_the_cast_dtype(getkey):
    mlp = nn.MLP(3, 2, 8, 2, key=getkey())
    x = jr.normal(getkey(), (5, 3))
    params, static = bw.partition(mlp, bw.is_array)

    def loss(p):
        model = bw.combine(bw.cast_floating(p, jnp.bfloat16), static)
        out = jax.vmap(model)(x.astype(jnp.bfloat16))
        return jnp.mean(out.astype(jnp.float32) ** 2)

    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(params).jaxpr
    dots = [e for e in all_equations(jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) == 8  # 3 forward, 5 backward (no gradient for `x`)
    operand_dtypes = {v.aval.dtype for e in dots for v in e.invars}
    assert operand_dtypes == {jnp.dtype(jnp.bfloat16)}
    # and without the cast the same loss multiplies in float32 (the test can fail)
    plain = jax.make_jaxpr(jax.grad(lambda p: jnp.sum(bw.combine(p, static)(x[0]))))
    dots = [
        e
        for e in all_equations(plain(params).jaxpr)
        if e.primitive.name == "dot_general"
    ]
    assert {v.aval.dtype for e in dots for v in e.invars} == {jnp.dtype(jnp.float32)}


def test_under_jit(getkey):
    tree = {"w": jnp.ones(3), "n": jnp.int32(2), "key": getkey()}
    out = bw.filter_jit(lambda t: bw.cast_floating(t, jnp.float16))(tree)
    assert out["w"].dtype == jnp.float16 and out["n"].dtype == jnp.int32
    assert jnp.issubdtype(out["key"].dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize("dtype", [jnp.int32, "bool", jnp.complex64, "not-a-dtype"])
def test_non_floating_dtype_is_refused(dtype):
    with pytest.raises(TypeError, match=r"`cast_floating`: `dtype` must be a floati"):
        bw.cast_floating({"w": jnp.ones(2)}, dtype)
