"""Runtime errors and donation of `filter_jit` calls, as in Equinox: a failed
`error_if` check raises `BoxwoodRuntimeError` with the user's message; a bound
method's module is donated; a donation warning is given once."""

import warnings

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw

# every test runs on the compiled and the Python warm-call path (conftest.py)


def _positive(x):
    return bw.error_if(x, x <= 0, "x must be positive")


def _calls(f, good, bad):
    """A failing call when cold, then warm (after good calls)."""
    with pytest.raises(bw.BoxwoodRuntimeError, match="x must be positive") as info:
        f(bad)
    for _ in range(3):
        f(good)
    with pytest.raises(bw.EquinoxRuntimeError, match="x must be positive") as warm:
        f(bad)
    return info.value, warm.value


def test_error_if_inside_filter_jit_raises_the_boxwood_error():
    f = bw.filter_jit(_positive)
    for error in _calls(f, jnp.ones(2), -jnp.ones(2)):
        assert type(error) is bw.BoxwoodRuntimeError
        assert str(error).startswith("x must be positive")
        assert "BOXWOOD_ON_ERROR=breakpoint" in str(error)
        # raised `from None`: XLA's report is not chained
        assert error.__cause__ is None and error.__suppress_context__
    assert jnp.allclose(f(jnp.ones(2)), 1.0)  # still usable afterwards


def test_error_if_under_filter_vmap_inside_filter_jit():
    f = bw.filter_jit(bw.filter_vmap(_positive))
    _calls(f, jnp.ones((3, 2)), jnp.ones((3, 2)).at[1, 0].set(-1.0))


def test_error_if_under_grad_inside_filter_jit():
    @bw.filter_jit
    def f(x):
        return jax.grad(lambda y: jnp.sum(_positive(y) ** 2))(x)

    _calls(f, jnp.ones(2), jnp.array([1.0, -1.0]))
    assert jnp.allclose(f(jnp.ones(2)), 2.0)


def test_error_if_in_a_module_method_with_keywords():
    class Checked(bw.Module):
        w: jax.Array

        def __call__(self, x):
            return bw.error_if(self.w * x, x.sum() > 10, "sum too large")

    f = bw.filter_jit(lambda m, x: m(x))
    m = Checked(jnp.ones(2))
    for _ in range(3):
        f(m, x=jnp.ones(2))
    with pytest.raises(bw.BoxwoodRuntimeError, match="sum too large"):
        f(m, x=jnp.full(2, 6.0))


def test_other_runtime_errors_are_left_alone():
    def f(x):
        return jax.pure_callback(_fail, jax.ShapeDtypeStruct((), jnp.float32), x)

    def _fail(x):
        raise KeyError("not a check")

    g = bw.filter_jit(f)
    for _ in range(2):
        with pytest.raises(Exception, match="not a check") as info:
            jax.block_until_ready(g(jnp.ones(())))  # (off the CPU: at the wait)
        assert not isinstance(info.value, bw.BoxwoodRuntimeError)


class Scale(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x, x * 2  # two outputs: both inputs' buffers can be reused


@pytest.mark.parametrize("donate", ["all", "warn", "all-except-first"])
def test_a_bound_methods_module_is_donated(donate):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for wrap in (lambda m: m.__call__, lambda m: m):
            model = Scale(jnp.ones(3))
            x = jnp.ones(3)
            f = bw.filter_jit(wrap(model), donate=donate)
            f(x)
            assert model.w.is_deleted()
            assert x.is_deleted() is (donate != "all-except-first")


def test_a_bound_methods_module_is_kept_without_donation():
    model = Scale(jnp.ones(3))
    f = bw.filter_jit(model.__call__)
    for _ in range(3):
        assert jnp.allclose(f(jnp.ones(3))[0], 1.0)
    assert not model.w.is_deleted()


def test_donation_warning_is_given_once_per_wrapper_and_message():
    def count(f, *xs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x in xs:
                f(x)
        return sum("could not be donated" in str(w.message) for w in caught)

    f = bw.filter_jit(lambda x: x.sum(), donate="warn", explain=False)
    # each shape traces again; the message names the shape, so two messages
    assert count(f, jnp.ones(3), jnp.ones(3), jnp.ones(4)) == 2
    f.clear_cache()  # traces again: the same messages are not repeated
    assert count(f, jnp.ones(3), jnp.ones(4)) == 0
    g = bw.filter_jit(lambda x: x.sum(), donate="warn")  # another wrapper: warns
    assert count(g, jnp.ones(3)) == 1


def test_a_failed_check_is_not_also_logged_by_jax(caplog):
    f = bw.filter_jit(_positive)
    f(jnp.ones(2))
    with caplog.at_level("ERROR", logger="jax._src.callback"):
        with pytest.raises(bw.BoxwoodRuntimeError):
            f(-jnp.ones(2))
    assert not [r for r in caplog.records if "pure_callback" in r.getMessage()]
