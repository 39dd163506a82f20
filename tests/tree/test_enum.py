import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


class RESULTS(bw.Enumeration):
    success = ""
    diverged = "the solver diverged"


class MORE(RESULTS):
    stalled = "the solver stalled"


def test_items_messages_and_equality():
    assert RESULTS[RESULTS.diverged] == "the solver diverged"
    assert len(RESULTS) == 2 and len(MORE) == 3
    assert bool(RESULTS.success == RESULTS.success)
    assert bool(RESULTS.success != RESULTS.diverged)
    assert isinstance(RESULTS.success, RESULTS) and not isinstance(
        MORE.success, RESULTS
    )
    assert repr(RESULTS.diverged).endswith("RESULTS<the solver diverged>")
    with pytest.raises(ValueError, match="same enumeration"):
        RESULTS.success == 0  # noqa: B015
    with pytest.raises(ValueError, match="same enumeration"):
        RESULTS.success == MORE.success  # noqa: B015
    with pytest.raises(AttributeError, match="has no item `missing`"):
        RESULTS.missing  # noqa: B018


def test_through_jit_where_and_vmap():
    f = jax.jit(lambda r: r == RESULTS.diverged)
    assert bool(f(RESULTS.diverged)) and not bool(f(RESULTS.success))
    r = jax.jit(lambda p: RESULTS.where(p, RESULTS.success, RESULTS.diverged))(
        jnp.array(False)
    )
    assert RESULTS[r] == "the solver diverged"
    batched = jax.vmap(lambda p: RESULTS.where(p, RESULTS.success, RESULTS.diverged))(
        jnp.array([True, False])
    )
    assert batched._value.tolist() == [0, 1]
    with pytest.raises(ValueError, match="scalar boolean `pred`"):
        RESULTS.where(jnp.array([True]), RESULTS.success, RESULTS.diverged)
    with pytest.raises(ValueError, match="`b` must be an item of `RESULTS`"):
        RESULTS.where(jnp.array(True), RESULTS.success, MORE.stalled)


def test_inheritance_and_promote():
    assert MORE[MORE.diverged] == "the solver diverged"
    promoted = MORE.promote(RESULTS.diverged)
    assert bool(promoted == MORE.diverged)
    with pytest.raises(ValueError, match="inherits from"):
        RESULTS.promote(MORE.stalled)


def test_error_if_uses_the_message():
    with pytest.raises(bw.BoxwoodRuntimeError, match="the solver diverged"):
        RESULTS.diverged.error_if(jnp.ones(2), True)
    f = jax.jit(lambda r, x: r.error_if(x, x < 0))
    assert f(RESULTS.diverged, jnp.array(1.0)) == 1.0
    with pytest.raises(Exception, match="the solver diverged"):
        jax.block_until_ready(f(RESULTS.diverged, jnp.array(-1.0)))  # async off CPU


def test_definition_errors():
    with pytest.raises(ValueError, match="cannot be named `where`"):

        class Bad(bw.Enumeration):
            where = "x"

    with pytest.raises(TypeError, match="must be a string"):

        class Bad2(bw.Enumeration):
            a = 1

    with pytest.warns(UserWarning, match="replaces the inherited"):

        class Changed(RESULTS):
            diverged = "new message"

    assert Changed[Changed.diverged] == "new message"
    assert bw.internal.Enumeration is bw.Enumeration
