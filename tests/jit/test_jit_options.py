"""Options that change compiled code identify it: two wrappers of one function with
different options never share compiled code (both call paths, both creation
orders), and a failed trace leaves no warnings filter behind."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


@pytest.fixture(autouse=True)
def _fresh_wrap_sites(monkeypatch):
    """Each test wraps fresh lambdas from the same line: count from zero."""
    from boxwood._jit import _cache

    monkeypatch.setattr(_cache, "_WRAPS_AT_SITE", type(_cache._WRAPS_AT_SITE)())


def _pair(x, y):
    return x + 1, y * 2


_OPTIONS = {
    "plain": {},
    "donate_all": {"donate": "all"},
    "donate_except_first": {"donate": "all-except-first"},
    "explain": {"explain": True},
    "keep_unused": {"keep_unused": True},
}


def _donated(opts):
    donate = opts.get("donate", "none")
    return {"none": (False, False), "all": (True, True)}.get(donate, (False, True))


@pytest.mark.parametrize(
    "first, second", list(itertools.permutations(sorted(_OPTIONS), 2))
)
def test_two_wrappers_with_different_options_do_not_share_code(first, second):
    fun = lambda x, y: _pair(x, y)  # one function object for both wrappers
    a = bw.filter_jit(fun, **_OPTIONS[first])
    b = bw.filter_jit(fun, **_OPTIONS[second])
    for wrapper, name in ((a, first), (b, second), (a, first)):
        for _ in range(2):  # cold, then warm (the fast path)
            x, y = jnp.ones(3), jnp.ones(3)
            out = wrapper(x, y)
            assert jnp.array_equal(out[0], jnp.full(3, 2.0))
            assert (x.is_deleted(), y.is_deleted()) == _donated(_OPTIONS[name]), name
    assert a.cache_info().traces == 1 and b.cache_info().traces == 1


def test_same_options_still_share_code():
    fun = lambda x: x + 1
    a, b = bw.filter_jit(fun, donate="all"), bw.filter_jit(fun, donate="all")
    a(jnp.ones(2))
    b(jnp.ones(2))
    assert b.cache_info().traces == 0


def _filters():
    return list(warnings.filters)


def test_a_trace_that_raises_leaves_no_warnings_filter():
    before = _filters()

    def bad(x):
        raise ValueError("user error while tracing")

    f = bw.filter_jit(bad, donate="all")
    with pytest.raises(ValueError, match="user error while tracing"):
        f(jnp.ones(2))
    assert _filters() == before


def test_a_compile_that_raises_leaves_no_warnings_filter():
    before = _filters()
    f = bw.filter_jit(
        lambda x: x + 1, donate="all", compiler_options={"no_such_xla_option": 1}
    )
    with pytest.raises(Exception, match="no_such_xla_option"):
        f(jnp.ones(2))
    assert _filters() == before
    g = bw.filter_jit(lambda x, y: x + 1, donate="all")
    g(jnp.ones(2), jnp.ones(5))  # an undonatable buffer: JAX's warning is silenced
    assert _filters() == before


def test_jit_keywords_pass_through_or_say_why_not():
    f = bw.filter_jit(lambda x, unused: x + 1, keep_unused=True, inline=False)
    assert jnp.array_equal(f(jnp.ones(2), jnp.ones(3)), jnp.full(2, 2.0))
    for name, hint in [
        ("static_argnums", "non-array arguments are static automatically"),
        ("donate_argnums", "use `donate=`"),
        ("no_such_option", "not a `jax.jit` keyword"),
    ]:
        with pytest.raises(TypeError, match=rf"`{name}`: .*{hint}"):
            bw.filter_jit(lambda x: x, **{name: 0})


def test_lower_and_compile_ahead_of_time(getkey):
    class Scale(bw.Module):
        w: jax.Array

        def __call__(self, x):
            return self.w * x

    model = Scale(jnp.full(2, 3.0))
    fn = lambda m, x, s: m(x) * s
    f = bw.filter_jit(fn, compiler_options={"xla_embed_ir_in_executable": True})
    lowered = f.lower(model, jnp.ones(2), 2.0)
    assert isinstance(lowered.flat, jax.stages.Lowered)
    assert "multiply" in lowered.as_text()
    compiled = lowered.compile()
    assert isinstance(compiled.flat, jax.stages.Compiled)
    # the flat form: the inner function's arrays in, its output arrays out
    (out,) = compiled.flat([model.w, jnp.ones(2)])
    assert jnp.array_equal(out, jnp.full(2, 6.0))
    assert jnp.array_equal(compiled(model, jnp.ones(2), 2.0), jnp.full(2, 6.0))
    assert jnp.array_equal(f(model, jnp.ones(2), 2.0), jnp.full(2, 6.0))
    assert f.cache_info().traces == 1  # the call reused the lowering's trace
    bound = bw.filter_jit(model.__call__).lower(jnp.ones(2))
    assert jnp.array_equal(bound.compile()(jnp.ones(2)), jnp.full(2, 3.0))
