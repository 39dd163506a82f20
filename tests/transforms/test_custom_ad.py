"""`filter_custom_jvp` and `filter_custom_vjp` against hand-computed derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood

# --- filter_custom_vjp --------------------------------------------------------------


def _make_scaled_sin(record):
    """`out = sin(a) * y`, with a backward rule that scales the true gradient by 10
    (so the test can tell that the custom rule ran)."""

    @boxwood.filter_custom_vjp
    def scaled_sin(vjp_arg, y, *, label):
        a, _count = vjp_arg
        return {"out": jnp.sin(a) * y, "label": label, "ints": jnp.arange(2)}

    @scaled_sin.def_fwd
    def fwd(perturbed, vjp_arg, y, *, label):
        record["perturbed"] = perturbed
        a, _ = vjp_arg
        return scaled_sin(vjp_arg, y, label=label), (jnp.cos(a), "residual-tag")

    @scaled_sin.def_bwd
    def bwd(residuals, grad_obj, perturbed, vjp_arg, y, *, label):
        cos_a, tag = residuals
        record["tag"], record["grad_obj"], record["label"] = tag, grad_obj, label
        return (grad_obj["out"] * cos_a * y * 10, None)

    return scaled_sin


def test_custom_vjp_primal_output():
    f = _make_scaled_sin({})
    a, y = jnp.array([0.5, 1.0]), jnp.array(3.0)
    out = f((a, 3), y, label="x")
    np.testing.assert_allclose(out["out"], jnp.sin(a) * 3, rtol=1e-6)
    assert out["label"] == "x"
    np.testing.assert_array_equal(out["ints"], [0, 1])


def test_custom_vjp_gradient_uses_the_rule():
    record = {}
    f = _make_scaled_sin(record)
    a, y = jnp.array([0.5, 1.0]), jnp.array(3.0)

    def loss(v):
        return jnp.sum(f(v, y, label="x")["out"])

    grads = boxwood.filter_grad(loss)((a, 3))
    np.testing.assert_allclose(grads[0], 10 * jnp.cos(a) * 3, rtol=1e-5)
    assert grads[1] is None
    assert record["perturbed"] == (True, False)
    assert record["tag"] == "residual-tag" and record["label"] == "x"
    assert record["grad_obj"]["label"] is None and record["grad_obj"]["ints"] is None
    np.testing.assert_allclose(record["grad_obj"]["out"], jnp.ones(2))


def test_custom_vjp_under_jit():
    f = _make_scaled_sin({})
    a, y = jnp.array([0.5, 1.0]), jnp.array(2.0)
    grad = jax.jit(
        boxwood.filter_grad(lambda a, y: jnp.sum(f((a, 1), y, label="j")["out"]))
    )
    np.testing.assert_allclose(grad(a, y), 10 * jnp.cos(a) * 2, rtol=1e-5)


def test_custom_vjp_unperturbed_leaf_is_marked():
    record = {}

    @boxwood.filter_custom_vjp
    def pair(v):
        return v[0] * v[1]

    @pair.def_fwd
    def pair_fwd(perturbed, v):
        record["pair"] = perturbed
        return pair(v), None

    @pair.def_bwd
    def pair_bwd(res, g, perturbed, v):
        return (g * v[1] if perturbed[0] else None, g * v[0] if perturbed[1] else None)

    a, b = jnp.array(2.0), jnp.array(5.0)
    assert jax.grad(lambda a: pair((a, b)))(a) == 5.0
    assert record["pair"] == (True, False)  # `b` is a float array, but not perturbed


def test_custom_vjp_differentiating_other_arguments_is_an_error():
    f = _make_scaled_sin({})
    a = jnp.array([0.5, 1.0])
    with pytest.raises(
        ValueError, match=r"with respect to `args\[0\]`.*first argument"
    ):
        jax.grad(lambda y: jnp.sum(f((a, 1), y, label="x")["out"]))(jnp.array(1.0))


def test_custom_vjp_without_rules_is_an_error():
    @boxwood.filter_custom_vjp
    def g(x):
        return x

    with pytest.raises(RuntimeError, match=r"`g` has no def_fwd or def_bwd rule"):
        g(jnp.ones(()))
    g.def_fwd(lambda perturbed, x: (x, None))
    with pytest.raises(RuntimeError, match=r"`g` has no def_bwd rule"):
        g(jnp.ones(()))


def _identity_with_bwd(bwd_result):
    @boxwood.filter_custom_vjp
    def ident(v):
        return v[0]

    ident.def_fwd(lambda perturbed, v: (ident(v), None))
    ident.def_bwd(lambda res, g, perturbed, v: bwd_result(g))
    return ident


def test_custom_vjp_bad_gradient_structure_is_an_error():
    ident = _identity_with_bwd(lambda g: [g])
    with pytest.raises(
        ValueError, match="must return gradients with the structure of `vjp_arg`"
    ):
        jax.grad(lambda x: ident((x, 1)))(jnp.array(1.0))


def test_custom_vjp_bad_gradient_shape_is_an_error():
    ident = _identity_with_bwd(lambda g: (jnp.ones(3), None))
    with pytest.raises(
        ValueError, match=r"shape \(3,\) for `vjp_arg\[0\]`, whose shape is \(\)"
    ):
        jax.grad(lambda x: ident((x, 1)))(jnp.array(1.0))


def test_custom_vjp_none_gradient_is_zero():
    ident = _identity_with_bwd(lambda g: None)
    assert jax.grad(lambda x: ident((x, 1)))(jnp.array(1.0)) == 0.0


# --- filter_custom_jvp --------------------------------------------------------------


def _make_call(record):
    @boxwood.filter_custom_jvp
    def call(x, y, *, fn):
        return fn(x, y)

    @call.def_jvp
    def call_jvp(primals, tangents, *, fn):
        x, y = primals
        tx, ty = tangents
        record["ty"] = ty
        out = call(x, y, fn=fn)
        terms = [2 * tx if tx is not None else None, 3 * ty if ty is not None else None]
        t_out = sum(t for t in terms if t is not None)
        return out, t_out

    return call


def test_custom_jvp_gradient_uses_the_rule():
    record = {}
    call = _make_call(record)
    x, y = jnp.array(2.0), jnp.array(5.0)
    add = lambda a, b: a + b  # noqa: E731
    assert call(x, y, fn=add) == 7.0
    assert boxwood.filter_grad(call)(x, y, fn=add) == 2.0
    assert record["ty"] is None  # `y` was not differentiated
    assert jax.grad(lambda y: call(x, y, fn=add))(y) == 3.0
    _, t = jax.jvp(
        lambda x, y: call(x, y, fn=add), (x, y), (jnp.array(1.0), jnp.array(1.0))
    )
    assert t == 5.0


def test_custom_jvp_non_array_arguments_and_outputs():
    seen = {}

    @boxwood.filter_custom_jvp
    def power(x, n, name):
        return x**n, name

    @power.def_jvp
    def power_jvp(primals, tangents):
        x, n, name = primals
        seen["tangents"] = tangents
        return power(x, n, name), (n * x ** (n - 1) * tangents[0], None)

    out, name = power(jnp.array(2.0), 3, "cube")
    assert out == 8.0 and name == "cube"
    grad = jax.grad(lambda x: power(x, 3, "cube")[0])(jnp.array(2.0))
    assert grad == 12.0
    assert seen["tangents"][1] is None and seen["tangents"][2] is None


def test_custom_jvp_integer_arrays_get_none_tangents():
    seen = {}

    @boxwood.filter_custom_jvp
    def take(x, i):
        return x[i]

    @take.def_jvp
    def take_jvp(primals, tangents):
        seen["ti"] = tangents[1]
        return take(*primals), tangents[0][primals[1]]

    grad = jax.grad(lambda x: take(x, jnp.array(1)))(jnp.arange(3.0))
    np.testing.assert_array_equal(grad, [0.0, 1.0, 0.0])
    assert seen["ti"] is None


def test_custom_jvp_without_rule_is_an_error():
    @boxwood.filter_custom_jvp
    def h(x):
        return x

    with pytest.raises(
        RuntimeError, match=r"no JVP rule for `h`; define one with `@h.def_jvp`"
    ):
        h(jnp.ones(()))


def test_custom_jvp_differentiating_a_keyword_argument_is_an_error():
    call = _make_call({})
    with pytest.raises(ValueError, match=r"keyword argument `\['scale'\]`"):
        jax.grad(
            lambda s: call(
                jnp.array(1.0), jnp.array(1.0), fn=lambda a, b, scale: a, scale=s
            )
        )(jnp.array(1.0))


def test_custom_jvp_bad_tangent_structure_is_an_error():
    @boxwood.filter_custom_jvp
    def two(x):
        return x, x

    two.def_jvp(lambda p, t: (two(*p), [t[0]]))
    with pytest.raises(ValueError, match="tangents whose structure does not match"):
        jax.grad(lambda x: two(x)[0])(jnp.array(1.0))
