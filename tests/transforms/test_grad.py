"""`filter_grad` / `filter_value_and_grad` against `jax.grad` on partitioned arrays."""

import warnings
from collections.abc import Callable

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood


class Net(boxwood.Module):
    weight: jax.Array
    bias: jax.Array
    index: jax.Array  # an integer array: not differentiable
    count: int  # a Python number leaf: not differentiable
    activation: Callable = boxwood.field(static=True)

    def __init__(self, key, activation=jnp.tanh):
        k1, k2 = jr.split(key)
        self.weight = jr.normal(k1, (3, 2))
        self.bias = jr.normal(k2, (3,))
        self.index = jnp.arange(3)
        self.count = 7
        self.activation = activation

    def __call__(self, x):
        return self.activation(self.weight @ x + self.bias)

    def loss(self, x):
        """The squared norm of the output."""
        return jnp.sum(self(x) ** 2)


def _loss(model, x):
    return jnp.sum(model(x) ** 2) + jnp.sum(model.bias)


def _expected_grad(fun, first, *rest):
    diff, nondiff = boxwood.partition(first, boxwood.is_inexact_array)
    return jax.grad(lambda d: fun(boxwood.combine(d, nondiff), *rest))(diff)


def _assert_trees_close(a, b):
    leaves_a, def_a = jax.tree_util.tree_flatten(a, is_leaf=lambda x: x is None)
    leaves_b, def_b = jax.tree_util.tree_flatten(b, is_leaf=lambda x: x is None)
    assert def_a == def_b
    for x, y in zip(leaves_a, leaves_b):
        if x is None or y is None:
            assert x is None and y is None
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_grad_of_module_matches_jax_grad(getkey):
    model, x = Net(getkey()), jr.normal(getkey(), (2,))
    grads = boxwood.filter_grad(_loss)(model, x)
    _assert_trees_close(grads, _expected_grad(_loss, model, x))
    assert grads.index is None and grads.count is None
    assert grads.activation is jnp.tanh  # static fields are kept
    assert jnp.any(grads.weight != 0)


def test_value_and_grad(getkey):
    model, x = Net(getkey()), jr.normal(getkey(), (2,))
    value, grads = boxwood.filter_value_and_grad(_loss)(model, x)
    np.testing.assert_allclose(value, _loss(model, x), rtol=1e-6)
    _assert_trees_close(grads, _expected_grad(_loss, model, x))


def test_has_aux(getkey):
    model, x = Net(getkey()), jr.normal(getkey(), (2,))

    def loss_aux(m, x):
        out = m(x)
        return jnp.sum(out**2), {"out": out, "tag": "aux"}

    grads, aux = boxwood.filter_grad(loss_aux, has_aux=True)(model, x)
    _assert_trees_close(grads, _expected_grad(lambda m, x: loss_aux(m, x)[0], model, x))
    np.testing.assert_allclose(aux["out"], model(x), rtol=1e-6)
    assert aux["tag"] == "aux"
    (value, aux2), grads2 = boxwood.filter_value_and_grad(loss_aux, has_aux=True)(
        model, x
    )
    np.testing.assert_allclose(value, loss_aux(model, x)[0], rtol=1e-6)
    assert aux2["tag"] == "aux"
    _assert_trees_close(grads, grads2)


def test_decorator_forms(getkey):
    x = jr.normal(getkey(), (3,))

    @boxwood.filter_grad
    def plain(p):
        return jnp.sum(p[0] ** 3)

    @boxwood.filter_grad(has_aux=True)
    def with_aux(p):
        return jnp.sum(p[0] ** 3), 5

    np.testing.assert_allclose(plain((x, "s"))[0], 3 * x**2, rtol=1e-5)
    assert plain((x, "s"))[1] is None
    grads, aux = with_aux((x, "s"))
    np.testing.assert_allclose(grads[0], 3 * x**2, rtol=1e-5)
    assert aux == 5


def test_only_the_first_argument_is_differentiated(getkey):
    a, b = jr.normal(getkey(), (3,)), jr.normal(getkey(), (3,))
    grads = boxwood.filter_grad(lambda a, b: jnp.sum(a * b))(a, b)
    np.testing.assert_allclose(grads, b)


def test_numpy_arrays_and_python_floats():
    grads = boxwood.filter_grad(lambda p: jnp.sum(jnp.asarray(p[0]) * p[1]))(
        (np.array([1.0, 2.0], dtype=np.float32), 3.0)
    )
    np.testing.assert_allclose(grads[0], [3.0, 3.0])
    assert grads[1] is None  # a Python float is not an array: treated as constant


_leaf = st.one_of(
    st.integers(1, 3).map(lambda n: jnp.linspace(-1.0, 1.0, n)),
    st.integers(1, 3).map(lambda n: jnp.arange(n)),
    st.integers(-3, 3),
    st.sampled_from(["a", "b"]),
)
_tree = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.sampled_from(["x", "y", "z"]), children, max_size=3),
    ),
    max_leaves=6,
)


def _tree_loss(tree):
    total = jnp.zeros(())
    for i, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
        if boxwood.is_inexact_array(leaf):
            total = total + (i + 1) * jnp.sum(jnp.sin(leaf) * leaf)
    return total


@settings(max_examples=15, deadline=None)
@given(_tree)
def test_random_pytrees_match_jax_grad(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    if any(boxwood.is_inexact_array(x) for x in leaves) or all(
        isinstance(x, str) for x in leaves
    ):
        grads = boxwood.filter_grad(_tree_loss)(tree)
    else:  # only integers: every gradient is None, and a warning says why
        with pytest.warns(UserWarning, match="every gradient is None"):
            grads = boxwood.filter_grad(_tree_loss)(tree)
    _assert_trees_close(grads, _expected_grad(_tree_loss, tree))
    for leaf, g in zip(
        jax.tree_util.tree_leaves(tree),
        jax.tree_util.tree_leaves(grads, is_leaf=lambda x: x is None),
    ):
        assert (g is None) == (not boxwood.is_inexact_array(leaf))


def test_bound_method_is_differentiated_in_its_first_explicit_argument(getkey):
    model, x = Net(getkey()), jr.normal(getkey(), (2,))
    grad_x = boxwood.filter_grad(model.loss)(x)
    expected = jax.grad(lambda x: model.loss(x))(x)
    np.testing.assert_allclose(grad_x, expected, rtol=1e-5)
    assert grad_x.shape == (2,)


def test_bound_method_wrapper_holds_the_module_arrays(getkey):
    model = Net(getkey())
    wrapper = boxwood.filter_grad(model.loss)
    leaves = jax.tree_util.tree_leaves(wrapper)
    assert any(leaf is model.weight for leaf in leaves)
    assert any(leaf is model.bias for leaf in leaves)


def test_bound_method_under_jit_traces_module_arrays(getkey):
    m1, m2 = Net(getkey()), Net(getkey())
    x = jr.normal(getkey(), (2,))
    traces = []

    def grad_of(model, x):
        traces.append(None)
        return boxwood.filter_grad(model.loss)(x)

    jitted = jax.jit(grad_of)
    for model in (m1, m2):
        expected = jax.grad(lambda x, m=model: m.loss(x))(x)
        np.testing.assert_allclose(jitted(model, x), expected, rtol=1e-5)
    assert len(traces) == 1  # the second module reused the first trace


def test_bound_method_wrapper_through_filter_jit(getkey):
    m1, m2 = Net(getkey()), Net(getkey())
    x = jr.normal(getkey(), (2,))
    apply = boxwood.filter_jit(lambda g, x: g(x))
    for model in (m1, m2):
        got = apply(boxwood.filter_grad(model.loss), x)
        expected = jax.grad(lambda x, m=model: m.loss(x))(x)
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_wrapper_metadata(getkey):
    def my_loss(p):
        """Docstring of my_loss."""
        return jnp.sum(p)

    wrapped = boxwood.filter_grad(my_loss)
    assert wrapped.__wrapped__ is my_loss
    assert wrapped.__name__ == "my_loss"
    assert wrapped.__doc__ == "Docstring of my_loss."
    model = Net(getkey())
    method_wrapper = boxwood.filter_value_and_grad(model.loss)
    assert method_wrapper.__name__ == "loss"
    assert method_wrapper.__doc__ == "The squared norm of the output."


def test_as_method_decorator(getkey):
    class Quadratic(boxwood.Module):
        a: jax.Array

        @boxwood.filter_grad
        def grad_wrt_self(self, x):
            return jnp.sum(self.a * x**2)

    q = Quadratic(jr.normal(getkey(), (3,)))
    x = jr.normal(getkey(), (3,))
    np.testing.assert_allclose(q.grad_wrt_self(x).a, x**2, rtol=1e-6)


def test_no_positional_argument_is_an_error():
    grad = boxwood.filter_grad(lambda x=1.0: x)
    with pytest.raises(TypeError, match="`filter_grad`.*got no arguments"):
        grad()
    with pytest.raises(TypeError, match="Pass the first argument by position"):
        grad(x=jnp.ones(()))
    with pytest.raises(
        TypeError, match="wrapped with `filter_value_and_grad` are differentiated"
    ):
        boxwood.filter_value_and_grad(lambda x=1.0: x)()


def test_a_gradient_that_is_none_everywhere_says_why():
    square = lambda x: jnp.sum(jnp.asarray(x, jnp.float32) ** 2)  # noqa: E731
    with pytest.warns(UserWarning, match=r"Python float at `args\[0\]`\)") as record:
        assert boxwood.filter_grad(square)(3.0) is None
    assert "jnp.asarray(x, dtype=float)" in str(record[0].message)
    assert record[0].filename == __file__  # points at the caller's line
    tree = {"ids": jnp.arange(3), "n": 2, "name": "x"}
    loss = lambda t: jnp.sum(t["ids"].astype(jnp.float32))  # noqa: E731
    match = r"int32 array at `args\[0\]\['ids'\]`, Python int at `args\[0\]\['n'\]`"
    with pytest.warns(UserWarning, match=match):
        grads = boxwood.filter_grad(loss)(tree)
    assert grads == {"ids": None, "n": None, "name": None}
    with pytest.warns(UserWarning, match="`filter_value_and_grad`.*bool array"):
        boxwood.filter_value_and_grad(lambda m: jnp.sum(m.astype(jnp.float32)))(
            jnp.ones(2, bool)
        )
    many = [1, 2, 3, 4, 5]
    with pytest.warns(UserWarning, match="and 2 more"):
        boxwood.filter_grad(lambda t: jnp.float32(sum(t)))(many)


def test_a_gradient_that_is_none_for_a_reason_one_chose_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # some leaves are floating-point arrays: the others being None is the filter
        grads = boxwood.filter_grad(lambda t: jnp.sum(t[0]) * t[1])((jnp.ones(2), 3))
        assert grads[1] is None
        # nothing numeric at all: nothing one could have meant to differentiate
        assert boxwood.filter_grad(lambda t: jnp.float32(1.0))(("a", len)) == (
            None,
            None,
        )


def test_the_none_gradient_warning_under_filter_jit_comes_once_per_trace():
    step = boxwood.filter_jit(
        boxwood.filter_grad(lambda x: jnp.sum(x.astype(jnp.float32)))
    )
    with pytest.warns(UserWarning, match="every gradient is None"):
        step(jnp.arange(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert step(jnp.arange(2)) is None  # compiled already: no trace, no warning
