import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


def test_assert_max_traces_counts_through_jit():
    @bw.filter_jit
    @bw.debug.assert_max_traces(max_traces=1)
    def f(x):
        return x + 1

    f(jnp.ones(2))
    f(jnp.zeros(2))
    assert bw.debug.get_num_traces(f) == 1
    with pytest.raises(
        RuntimeError, match="can only be traced 1 times.*trace number 2"
    ):
        f(jnp.ones(3))


def test_assert_max_traces_none_and_jax_jit_copies_share_a_counter():
    g = bw.debug.assert_max_traces(lambda x: x * 2, max_traces=None)
    jitted = jax.jit(g)
    for n in range(1, 4):
        jitted(jnp.ones(n))
    assert bw.debug.get_num_traces(g) == 3
    with pytest.raises(ValueError, match="not wrapped with"):
        bw.debug.get_num_traces(lambda x: x)


def test_breakpoint_if_false_is_a_no_op():
    out = jax.jit(lambda x: bw.debug.breakpoint_if(x > 10, token=x))(jnp.array(1.0))
    assert out == 1.0
    batched = jax.vmap(lambda x: (bw.debug.breakpoint_if(x > 10), x)[1])
    assert batched(jnp.arange(3.0)).tolist() == [0.0, 1.0, 2.0]


def test_announce_transform():
    seen = []

    def f(x):
        return bw.debug.announce_transform(x, name="x", announce=seen.append)

    jax.jit(jax.vmap(f))(jnp.ones(2))
    assert seen == ["(x) vmap:abstract", "(x) vmap:mlir"]
    seen.clear()
    jax.grad(lambda x: f(x) ** 2)(1.0)
    assert "(x) jvp:transpose:impl" in seen
    seen.clear()
    jax.vmap(lambda x: bw.debug.announce_transform(
        x, intermediates=True, announce=seen.append))(jnp.ones(2))  # fmt: skip
    assert seen[0] == "vmap"
    assert bw.debug.announce_transform({"s": "str"}, announce=seen.append) == {
        "s": "str"
    }


def test_backward_nan_prints_and_raises(capfd):
    def loss(x):
        y = bw.debug.backward_nan(x, name="y")
        return jnp.sum(jnp.sqrt(y))

    assert jax.grad(loss)(jnp.array([4.0])).tolist() == [0.25]
    jax.effects_barrier()
    assert "cotangents=" in capfd.readouterr().out
    with pytest.raises(Exception, match="NaN cotangent in `y`"):
        jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.array([-1.0])))
    quiet = jax.grad(
        lambda x: jnp.sum(jnp.sqrt(bw.debug.backward_nan(x, terminate=False)))
    )
    assert jnp.isnan(quiet(jnp.array([-1.0]))).all()


def test_store_and_inspect_dce(capsys):
    @jax.jit
    def f(x):
        a, b = bw.debug.store_dce((x * 2, x + 1), name="test_dce")
        return a

    f(jnp.ones(3))
    bw.debug.inspect_dce(name="test_dce")
    out = capsys.readouterr().out
    assert "Found 1 call to `store_dce`." in out
    assert "(f32[3], <DCE'd>)" in out
    with pytest.raises(RuntimeError, match="inside `jax.jit`"):
        bw.debug.store_dce(jnp.ones(1))
    with pytest.raises(RuntimeError, match="outside of `jax.jit`"):
        jax.jit(lambda x: (bw.debug.inspect_dce(), x)[1])(jnp.ones(1))
