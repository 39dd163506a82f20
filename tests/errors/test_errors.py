import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


def test_equinox_name_is_the_boxwood_class():
    assert bw.EquinoxRuntimeError is bw.BoxwoodRuntimeError
    assert issubclass(bw.BoxwoodRuntimeError, RuntimeError)


def test_known_predicate_raises_at_once():
    x = jnp.array([1.0, -1.0])
    with pytest.raises(bw.EquinoxRuntimeError, match="^x must be positive$"):
        bw.error_if(x, x < 0, "x must be positive")
    assert bw.error_if(x, x > 5, "never") is x
    with pytest.raises(bw.BoxwoodRuntimeError, match="python bool"):
        bw.error_if(x, True, "python bool")


def test_inside_jit_raises_when_run():
    f = jax.jit(lambda x: jnp.sqrt(bw.error_if(x, x < 0, "negative input")))
    assert f(jnp.array([4.0])).tolist() == [2.0]
    with pytest.raises(Exception, match="BoxwoodRuntimeError: negative input"):
        jax.block_until_ready(f(jnp.array([-4.0])))  # async off the CPU


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="words of the CPU runtime")
def test_plain_jit_report_is_short():
    """XLA's CPU runtime reports the Python call stack above the raise: the
    check's error is raised with a traceback of one frame, so that the message
    is the third line, not the last of dozens; the check's site follows it."""

    def deep(n, x):
        return deep(n - 1, x) if n else jax.jit(f)(x).block_until_ready()

    f = lambda x: bw.error_if(x, x < 0, "negative input")
    with pytest.raises(Exception, match="negative input") as info:
        deep(20, jnp.array(-4.0))
    lines = str(info.value).splitlines()
    assert lines[2:5] == [
        "BoxwoodRuntimeError: negative input",
        "",
        "The check that failed (traced inside the compiled function):",
    ], lines
    assert "in failed_check" in lines[1]
    assert "test_errors.py" in lines[5] and "error_if" in lines[6]
    assert len(lines) == 7, lines  # no frame of the 20 calls above


def test_inside_filter_jit_raises_when_run():
    @bw.filter_jit
    def f(x, name):
        return bw.error_if(x, x < 0, f"{name} is negative")

    assert f(jnp.array([1.0]), "y").tolist() == [1.0]
    with pytest.raises(Exception, match="y is negative"):
        jax.block_until_ready(f(jnp.array([-1.0]), "y"))


def test_inside_filter_vmap_any_batch_element_raises():
    f = jax.jit(bw.filter_vmap(lambda x: bw.error_if(x, x < 0, "bad element")))
    assert f(jnp.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    with pytest.raises(Exception, match="bad element"):
        jax.block_until_ready(f(jnp.array([1.0, -2.0])))


def test_under_grad_passes_gradients_and_raises():
    def loss(x):
        return jnp.sum(bw.error_if(x, x < 0, "negative in loss") ** 2)

    assert jax.grad(loss)(jnp.array([1.0, 2.0])).tolist() == [2.0, 4.0]
    assert jax.jit(jax.grad(loss))(jnp.array([3.0])).tolist() == [6.0]
    with pytest.raises(Exception, match="negative in loss"):
        jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.array([-3.0])))


def test_branched_error_if_picks_message_and_vmap_takes_largest_index():
    msgs = ["first", "second", "third"]
    f = jax.jit(lambda x, i: bw.branched_error_if(x, x < 0, i, msgs))
    with pytest.raises(Exception, match="second"):
        jax.block_until_ready(f(jnp.array(-1.0), jnp.array(1)))
    g = jax.jit(jax.vmap(lambda x, i: bw.branched_error_if(x, x < 0, i, msgs)))
    with pytest.raises(Exception, match="third"):
        jax.block_until_ready(g(jnp.array([-1.0, 1.0]), jnp.array([0, 2])))


def test_on_error_nan_and_off():
    x = jnp.array([1.0, -1.0])
    nan = jax.jit(lambda x: bw.error_if(x, x < 0, "m", on_error="nan"))(x)
    assert jnp.isnan(nan).all()
    assert jax.jit(lambda x: bw.error_if(x, x < 0, "m", on_error="off"))(x) is not None
    with pytest.warns(UserWarning, match="known to fail when traced \\('m'\\)"):
        ints = bw.error_if(jnp.array([1, 2]), True, "m", on_error="nan")
    assert ints.tolist() == [jnp.iinfo(jnp.int32).max] * 2


def test_environment_variable_chooses_default(monkeypatch):
    monkeypatch.setenv("EQX_ON_ERROR", "nan")
    with pytest.warns(UserWarning, match="on_error='nan'"):
        assert jnp.isnan(bw.error_if(jnp.array([1.0]), True, "m")).all()
    monkeypatch.setenv("BOXWOOD_ON_ERROR", "bogus")
    with pytest.raises(ValueError, match="BOXWOOD_ON_ERROR.*'bogus'"):
        bw.error_if(jnp.array([1.0]), True, "m")


def test_bad_arguments():
    with pytest.raises(ValueError, match="`on_error` must be"):
        bw.error_if(jnp.ones(1), True, "m", on_error="explode")
    with pytest.raises(TypeError, match="`msg` must be a string"):
        bw.error_if(jnp.ones(1), True, 3)
    with pytest.raises(ValueError, match="at least one array in `x`"):
        jax.jit(lambda p: bw.error_if("no arrays", p, "m"))(jnp.array(True))


def test_non_array_leaves_pass_through():
    tree = {"w": jnp.ones(2), "act": "relu"}
    out = bw.filter_jit(lambda t: bw.error_if(t, t["w"] < 0, "m"))(tree)
    assert out["act"] == "relu" and out["w"].tolist() == [1.0, 1.0]


def test_as_boxwood_error_recovers_the_message_from_xla():
    from boxwood._errors import as_boxwood_error

    f = jax.jit(lambda x: bw.error_if(x, x < 0, "line one\nline two"))
    f(jnp.array(1.0))  # warm: the second call takes JAX's C++ dispatch path
    for _ in range(2):
        with pytest.raises(Exception) as info:
            jax.block_until_ready(f(jnp.array(-1.0)))
        recovered = as_boxwood_error(info.value)
        assert isinstance(recovered, bw.BoxwoodRuntimeError)
        message, _, site = str(recovered).partition("\n\n")
        assert message == "line one\nline two"
        assert site.startswith("The check that failed") and __file__ in site
    assert as_boxwood_error(ValueError("unrelated")) is None
