import jax
import jax.numpy as jnp
import pytest

import boxwood as bw
import boxwood.internal as bwi


def test_docstring_states_the_api_may_change():
    assert "may change" in bwi.__doc__
    assert bwi.error_if is bw.error_if and bwi.branched_error_if is bw.branched_error_if
    assert bwi.debug_backward_nan is bw.debug.backward_nan


def test_omega():
    ω = bwi.ω
    a = {"x": jnp.array(1.0), "y": jnp.array([2.0, 3.0])}
    b = {"x": jnp.array(10.0), "y": jnp.array([20.0, 30.0])}
    assert (ω(a) + ω(b)).ω["y"].tolist() == [22.0, 33.0]
    assert (a**ω * 2 - 1).ω["x"] == 1.0
    assert (2 - a**ω).ω["x"] == 1.0
    assert (-(a**ω)).ω["x"] == -1.0 and abs(ω(a) * -1).ω["x"] == 1.0
    assert (ω(a) < 2).ω["y"].tolist() == [False, False]
    assert ω({"y": a["y"]})[0].ω["y"] == 2.0
    assert ω({"y": a["y"]}).at[0].set(9.0).ω["y"].tolist() == [9.0, 3.0]
    assert ω({"y": a["y"]}).at[1].add(ω({"y": jnp.array(1.0)})).ω["y"][1] == 4.0
    assert ω(a).call(jnp.sin).ω["x"] == jnp.sin(1.0)
    assert repr(ω(1)) == "ω(1)"
    with pytest.raises(ValueError, match="same structure"):
        ω(a) + ω([1.0])
    with pytest.raises(TypeError, match="takes another `ω`"):
        ω(a) + "s"


def test_static_holds_structure():
    s = bwi.Static({"act": "relu", "sizes": (1, 2)})
    assert jax.tree_util.tree_leaves(s) == []
    out = jax.jit(lambda: bwi.Static(("a", 1)))()
    assert out.value == ("a", 1)


def test_getkey(monkeypatch):
    getkey = bwi.GetKey(seed=3)
    k1, k2 = getkey(), getkey()
    assert not (jax.random.key_data(k1) == jax.random.key_data(k2)).all()
    assert getkey.call == 2 and "seed=3" in repr(getkey)
    monkeypatch.setenv("EQX_GETKEY_SEED", "7")
    assert bwi.GetKey().seed == 7


def test_closure_to_pytree():
    def make(scale):
        a = jnp.array(scale)
        return bwi.closure_to_pytree({"f": lambda x: a * x, "g": jnp.sin})

    tree = make(2.0)
    assert jax.tree_util.tree_leaves(tree)[0] == 2.0
    assert tree["f"](3.0) == 6.0 and tree["g"] is jnp.sin
    doubled = jax.tree_util.tree_map(lambda x: x * 2 if bw.is_array(x) else x, tree)
    assert doubled["f"](3.0) == 12.0
    # closures of the same code have the same structure
    assert jax.tree_util.tree_structure(make(1.0)) == jax.tree_util.tree_structure(tree)


def test_unvmap():
    assert jax.vmap(bwi.unvmap_any)(jnp.array([False, True])).tolist() == [True, True]
    assert jax.vmap(bwi.unvmap_all)(jnp.array([False, True])).tolist() == [False] * 2
    nested = jax.vmap(jax.vmap(bwi.unvmap_max))(jnp.array([[1, 5], [2, 3]]))
    assert nested.tolist() == [[5, 5], [5, 5]]
    assert (
        bwi.unvmap_any(jnp.array([False, True])) and bwi.unvmap_max(jnp.arange(3)) == 2
    )


def test_nondifferentiable():
    f = lambda x: bwi.nondifferentiable(x, name="`f`") * 2  # noqa: E731
    assert f(jnp.array(1.0)) == 2.0
    with pytest.raises(RuntimeError, match="`f` cannot be differentiated"):
        jax.grad(f)(1.0)
    with pytest.raises(RuntimeError, match="custom message"):
        jax.jvp(
            lambda x: bwi.nondifferentiable(x, msg="custom message"), (1.0,), (1.0,)
        )


def test_nondifferentiable_backward():
    f = lambda x: bwi.nondifferentiable_backward(x, name="`f`") ** 2  # noqa: E731
    assert jax.jvp(f, (2.0,), (1.0,))[1] == 4.0  # forward mode passes
    assert jax.vmap(f)(jnp.arange(3.0)).tolist() == [0.0, 1.0, 4.0]
    with pytest.raises(RuntimeError, match="`f` cannot be differentiated in reverse"):
        jax.grad(f)(2.0)
    g = lambda x: bwi.nondifferentiable_backward(x, symbolic=False) ** 2  # noqa: E731
    with pytest.raises(Exception, match="Unexpected cotangent"):
        jax.block_until_ready(jax.jit(jax.grad(g))(2.0))  # async off the CPU
