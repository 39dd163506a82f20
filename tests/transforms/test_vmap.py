"""`filter_vmap` and `if_array`."""

from collections.abc import Callable

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from hypothesis import given, settings

import boxwood


class Small(boxwood.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float  # a Python number leaf: broadcast, never batched
    activation: Callable = boxwood.field(static=True)

    def __init__(self, key):
        k1, k2 = jr.split(key)
        self.weight = jr.normal(k1, (2, 3))
        self.bias = jr.normal(k2, (2,))
        self.scale = 0.5
        self.activation = jax.nn.relu

    def __call__(self, x):
        return self.scale * self.activation(self.weight @ x + self.bias)


def test_default_axes():
    f = boxwood.filter_vmap(lambda x, y: x + y)
    np.testing.assert_array_equal(f(jnp.array([1, 2]), jnp.array([3, 4])), [4, 6])
    np.testing.assert_array_equal(f(jnp.array([1, 2]), 3), [4, 5])  # 3 broadcast


def test_in_axes_none_and_int():
    g = boxwood.filter_vmap(lambda x, y: x + y, in_axes=(None, 1))
    out = g(jnp.array(1), jnp.array([[2, 3]]))
    np.testing.assert_array_equal(out, [[3], [4]])


def test_ensemble_matches_loop(getkey):
    keys = jr.split(getkey(), 4)
    ensemble = boxwood.filter_vmap(lambda k: Small(k))(keys)
    assert isinstance(ensemble, Small)
    assert ensemble.weight.shape == (4, 2, 3) and ensemble.bias.shape == (4, 2)
    assert ensemble.scale == 0.5 and ensemble.activation is jax.nn.relu
    members = [Small(k) for k in keys]
    for i, m in enumerate(members):
        np.testing.assert_allclose(ensemble.weight[i], m.weight, rtol=1e-6)

    xs = jr.normal(getkey(), (4, 3))
    out = boxwood.filter_vmap(lambda m, x: m(x))(ensemble, xs)
    expected = jnp.stack([m(x) for m, x in zip(members, xs)])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)

    x = jr.normal(getkey(), (3,))
    same = boxwood.filter_vmap(lambda m, x: m(x), in_axes=(boxwood.if_array(0), None))(
        ensemble, x
    )
    np.testing.assert_allclose(
        same, jnp.stack([m(x) for m in members]), rtol=1e-5, atol=1e-6
    )


def test_ensemble_under_jit(getkey):
    ensemble = boxwood.filter_vmap(lambda k: Small(k))(jr.split(getkey(), 3))
    xs = jr.normal(getkey(), (3, 3))
    apply = boxwood.filter_jit(boxwood.filter_vmap(lambda m, x: m(x)))
    np.testing.assert_allclose(
        apply(ensemble, xs),
        boxwood.filter_vmap(lambda m, x: m(x))(ensemble, xs),
        rtol=1e-6,
    )


def test_non_array_leaves_are_broadcast():
    seen = []

    def f(x, tag, n):
        seen.append((tag, n))
        return x * n, tag

    out, tag = boxwood.filter_vmap(f)(jnp.arange(3.0), "hello", 2)
    np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])
    assert tag == "hello"
    assert seen == [("hello", 2)]


def test_in_axes_prefix_and_callables():
    def f(a, b):
        return a["p"] + b["q"] * b["r"]

    a = {"p": jnp.ones((2, 4))}
    b = {"q": jnp.arange(2.0), "r": jnp.arange(8.0).reshape(2, 4)}
    in_axes = (1, {"q": None, "r": lambda x: 1 if x.ndim == 2 else None})
    out = boxwood.filter_vmap(f, in_axes=in_axes)(a, b)
    expected = jnp.stack([a["p"][:, i] + b["q"] * b["r"][:, i] for i in range(4)])
    np.testing.assert_allclose(out, expected)


def test_in_axes_dict_by_name():
    def f(x, y, z):
        return x + y + z

    out = boxwood.filter_vmap(f, in_axes=dict(y=None))(
        jnp.arange(3.0), jnp.ones(()), jnp.arange(3.0)
    )
    np.testing.assert_allclose(out, 2 * jnp.arange(3.0) + 1)


def test_out_axes():
    x = jnp.arange(6.0).reshape(3, 2)
    f = lambda x: (x, x * 2)  # noqa: E731
    a, b = boxwood.filter_vmap(f, out_axes=(1, -1))(x)
    np.testing.assert_array_equal(a, x.T)
    np.testing.assert_array_equal(b, 2 * x.T)
    const = boxwood.filter_vmap(lambda x: (x, jnp.ones(2)), out_axes=(0, None))(x)
    np.testing.assert_array_equal(const[1], jnp.ones(2))  # not batched


def test_unbatched_constant_arrays_get_stacked_by_default():
    out = boxwood.filter_vmap(lambda x: {"x": x, "c": jnp.zeros(2)})(jnp.arange(3.0))
    assert out["c"].shape == (3, 2)


def test_axis_name_and_axis_size():
    f = boxwood.filter_vmap(lambda x: x - jax.lax.pmean(x, "b"), axis_name="b")
    np.testing.assert_allclose(f(jnp.array([1.0, 3.0])), [-1.0, 1.0])
    g = boxwood.filter_vmap(lambda n: jnp.full((2,), n), in_axes=None, axis_size=3)
    np.testing.assert_array_equal(g(7), jnp.full((3, 2), 7))


def test_decorator_with_arguments():
    @boxwood.filter_vmap(in_axes=(0, None))
    def f(x, y):
        return x * y

    np.testing.assert_array_equal(f(jnp.arange(3), jnp.array(2)), [0, 2, 4])


def test_if_array():
    spec = boxwood.if_array(2)
    assert spec(jnp.zeros((1, 1, 1))) == 2
    assert spec(np.zeros(3)) == 2
    assert spec(1.0) is None and spec("a") is None


_leaf = st.one_of(
    st.integers(0, 2).map(lambda n: jnp.arange(3.0 * 2**n).reshape((3,) + (2,) * n)),
    st.integers(-5, 5),
    st.sampled_from(["s", None]),
)
_tree = st.recursive(
    _leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=3),
        st.dictionaries(st.text("ab", max_size=2), c, max_size=2),
    ),
    max_leaves=5,
)


def _index(tree, i):
    return jax.tree.map(lambda x: x[i] if boxwood.is_array(x) else x, tree)


@settings(max_examples=15, deadline=None)
@given(_tree)
def test_random_pytrees_match_a_loop(tree):
    def f(t):
        return jax.tree.map(lambda x: x * 2 + 1 if boxwood.is_array(x) else x, t)

    if not any(boxwood.is_array(x) for x in jax.tree_util.tree_leaves(tree)):
        return  # nothing to vectorise (covered by the axis_size tests)
    out = boxwood.filter_vmap(f)(tree)
    for i in range(3):
        sliced = _index(tree, i)
        expected = f(sliced)
        got = _index(out, i)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
            expected
        )
        for g, e in zip(
            jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)
        ):
            if boxwood.is_array(e):
                np.testing.assert_array_equal(g, e)
            else:
                assert g == e


def test_wrapper_metadata():
    def my_fun(x):
        """Doc."""
        return x

    wrapped = boxwood.filter_vmap(my_fun)
    assert wrapped.__wrapped__ is my_fun
    assert wrapped.__name__ == "my_fun" and wrapped.__doc__ == "Doc."


def test_keyword_arguments_are_an_error():
    with pytest.raises(TypeError, match=r"positional arguments only.*\['y'\]"):
        boxwood.filter_vmap(lambda x, y: x + y)(jnp.ones(2), y=jnp.ones(2))


def test_bad_in_axes_leaf_names_the_path():
    f = boxwood.filter_vmap(lambda x, y: x, in_axes=(0, {"a": "zero"}))
    with pytest.raises(ValueError, match=r"has str 'zero' at args\[1\]\['a'\]"):
        f(jnp.ones(2), {"a": jnp.ones(2)})


def test_callable_returning_bad_axis_names_the_path():
    f = boxwood.filter_vmap(lambda x: x, in_axes=lambda x: "0")
    with pytest.raises(ValueError, match=r"gave '0' for args\[0\]"):
        f(jnp.ones(2))


def test_int_axis_for_non_array_names_the_path():
    f = boxwood.filter_vmap(lambda x, n: x * n, in_axes=(0, 0))
    with pytest.raises(ValueError, match=r"vectorise args\[1\] along axis 0.*int 3"):
        f(jnp.ones(2), 3)


def test_in_axes_not_a_prefix():
    f = boxwood.filter_vmap(lambda x, y: x, in_axes=(0, 0, 0))
    with pytest.raises(ValueError, match="`in_axes` must be a pytree prefix of args"):
        f(jnp.ones(2), jnp.ones(2))


def test_in_axes_dict_with_unknown_name():
    f = boxwood.filter_vmap(lambda x, y: x, in_axes=dict(z=0))
    with pytest.raises(ValueError, match=r"names \['z'\]"):
        f(jnp.ones(2), jnp.ones(2))


def test_nothing_vectorised_without_axis_size():
    f = boxwood.filter_vmap(lambda x: x, in_axes=None)
    with pytest.raises(ValueError, match=r"batch size .* unknown\. Pass `axis_size=`"):
        f(jnp.ones(2))


def test_nothing_vectorised_with_unbatched_outputs_runs_once():
    # As in Equinox (lineax's tests build their operators this way): nothing
    # vectorised and every output given `None` is a plain call.
    calls = []

    def make(name, scale):
        calls.append(name)
        return jnp.ones(3) * scale, name

    out, name = boxwood.filter_vmap(make, out_axes=None)("m", 2.0)
    assert calls == ["m"] and name == "m"
    assert out.shape == (3,) and jnp.all(out == 2.0)
    # a non-array output under the default `out_axes` needs no batch size either
    assert boxwood.filter_vmap(lambda s: s + "!")("a") == "a!"
    # no batch axis exists to reduce over: a collective fails, as in Equinox,
    # instead of pretending to a batch of one
    f = boxwood.filter_vmap(
        lambda x: x * jax.lax.psum(1, "i"), out_axes=None, axis_name="i"
    )
    with pytest.raises(NameError, match="unbound axis name: i"):
        f(2.0)


def test_out_axes_int_for_non_array_output():
    f = boxwood.filter_vmap(lambda x: (x, "tag"), out_axes=0)
    with pytest.raises(
        ValueError, match=r"`out_axes` says to vectorise the output\[1\]"
    ):
        f(jnp.ones(2))
