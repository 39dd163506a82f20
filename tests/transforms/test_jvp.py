import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


def test_filter_jvp_any_pytree():
    def f(x, y, name):
        return {"out": x * y, "name": name, "const": jnp.ones(2), "int": 3}

    primals = (jnp.array(2.0), jnp.array(3.0), "tag")
    out, tangent = bw.filter_jvp(f, primals, (jnp.array(1.0), None, None))
    assert out["name"] == "tag" and out["int"] == 3
    assert out["out"] == 6.0 and tangent["out"] == 3.0
    # outputs that do not depend on a perturbed input get None, as in Equinox
    assert tangent["const"] is None and tangent["name"] is None
    assert tangent["int"] is None


def test_filter_jvp_kwargs_and_no_perturbation():
    out, tangent = bw.filter_jvp(lambda x, *, k: x * k, (jnp.array(2.0),), (None,), k=4)
    assert out == 8.0 and tangent is None
    out, tangent = bw.filter_jvp(lambda x: x * 3.0, (2.0,), (1.0,))  # Python floats
    assert out == 6.0 and tangent == 3.0


def test_filter_jvp_errors():
    with pytest.raises(ValueError, match="structure of `primals`"):
        bw.filter_jvp(lambda x: x, (1.0, 2.0), (1.0,))
    with pytest.raises(ValueError, match=r"`primals\[0\]` is not floating-point"):
        bw.filter_jvp(lambda x: x, ("a",), (1.0,))


def test_filter_vjp_and_has_aux():
    def f(x, n):
        return {"y": x * n, "label": "l"}, "aux"

    out, vjp_fn, aux = bw.filter_vjp(f, jnp.array(2.0), 3, has_aux=True)
    assert aux == "aux" and out["label"] == "l"
    ct_x, ct_n = vjp_fn({"y": jnp.array(1.0), "label": None})
    assert ct_x == 3.0 and ct_n is None


@pytest.mark.parametrize("jac", [bw.filter_jacfwd, bw.filter_jacrev])
def test_jacobians(jac):
    params = {"w": jnp.array([1.0, 2.0]), "act": "relu", "n": jnp.array(3)}
    j = jac(lambda p, x: p["w"] ** 2 * x)(params, 2.0)
    assert j["w"].tolist() == [[4.0, 0.0], [0.0, 8.0]]
    assert j["act"] is None and j["n"] is None
    j, aux = jac(lambda p: (p["w"] * 2, "aux"), has_aux=True)(params)
    assert aux == "aux" and j["w"].tolist() == [[2.0, 0.0], [0.0, 2.0]]


def test_hessian():
    h = bw.filter_hessian(lambda p: jnp.sum(p[0] ** 3) + p[1])(
        (jnp.array([1.0, 2.0]), 1)
    )
    assert h[0][0].tolist() == [[6.0, 0.0], [0.0, 12.0]]


def test_gradkwargs_are_passed_to_jax():
    f = bw.filter_grad(lambda z: jnp.real(z * jnp.conj(z)) + 0j, holomorphic=False)
    with pytest.raises(TypeError, match="holomorphic"):
        bw.filter_grad(lambda z: z**2, holomorphic=True)(jnp.array(1.0))
    assert (
        bw.filter_grad(lambda z: z**2, holomorphic=True)(jnp.array(1.0 + 1j)) == 2 + 2j
    )
    del f
    (value, aux), grads = bw.filter_value_and_grad(
        lambda x: (jnp.sum(x**2), "a"), has_aux=True, allow_int=True
    )(jnp.array([1.0]))
    assert value == 1.0 and aux == "a" and grads.tolist() == [2.0]
    decorated = bw.filter_grad(holomorphic=True)(lambda z: z**2)
    assert decorated(jnp.array(2.0 + 0j)) == 4.0
    with pytest.raises(TypeError, match="no `argnums`"):
        bw.filter_grad(lambda x: x, argnums=1)


def test_filter_closure_convert_exposes_tracers():
    def outer(z):
        g = bw.filter_closure_convert(
            lambda a, t: {"v": z * a, "t": t}, jnp.ones(()), "t"
        )
        assert len(g.consts) == 1
        return g(jnp.array(3.0), "t")["v"]

    assert jax.grad(outer)(2.0) == 3.0
    assert jax.jit(outer)(2.0) == 6.0


def test_filter_closure_convert_checks_arguments():
    g = bw.filter_closure_convert(lambda a, k: a * k, jnp.ones(2), 2)
    assert g(jnp.full(2, 3.0), 2).tolist() == [6.0, 6.0]
    with pytest.raises(ValueError, match="arrays of other shapes or dtypes"):
        g(jnp.ones(3), 2)
    with pytest.raises(ValueError, match="other non-array arguments"):
        g(jnp.ones(2), 3)


def test_filter_closure_convert_keeps_weak_types():
    # A weakly typed example argument (a Python scalar made an array) stays weak in
    # the converted function's trace, as in the function's own: under x64 with
    # strict promotion, `float64 * weak int` is fine, `float64 * int64` an error
    # (diffrax's implicit solvers and dense interpolation hit it).
    def outer(z):
        n = jnp.asarray(2)
        f = bw.filter_closure_convert(lambda n: z * n, n)
        return f(n), f(jnp.asarray(3, jnp.int64)).dtype

    # x64 for this block only (JAX keys its caches on it); promotion is strict
    # throughout the suite
    with jax.enable_x64(True):
        value, dtype = bw.filter_jit(outer)(jnp.asarray(1.5))
        assert value.dtype == jnp.float64 and float(value) == 3.0
        assert dtype == jnp.float64
