"""`boxwood.random`: keys split and values drawn without a compile per shape, bit
for bit those of `jax.random`."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import boxwood as bw
from _precision import assert_same_draws
from _strategies import SETTINGS
from boxwood._init import _draw


def _words(keys) -> bytes:
    """The key data of a tuple or array of keys, typed or raw, as bytes."""
    stacked = jnp.stack(list(keys)) if isinstance(keys, tuple) else keys
    if jnp.issubdtype(stacked.dtype, jax.dtypes.prng_key):
        stacked = jr.key_data(stacked)
    return np.asarray(stacked).tobytes()


@settings(**{**SETTINGS, "max_examples": 40})
@given(
    seed=st.integers(0, 2**32 - 1),
    num=st.integers(0, 40),
    typed=st.booleans(),
)
def test_split_keys_bit_identical(seed, num, typed):
    key = jr.key(seed) if typed else jr.PRNGKey(seed)
    keys = bw.random.split_keys(key, num)
    assert isinstance(keys, tuple) and len(keys) == num
    if num:
        direct = jr.split(key, num)
        assert all((k.dtype, k.shape) == (direct.dtype, direct.shape[1:]) for k in keys)
        assert _words(keys) == _words(direct)


def test_split_keys_unpacks_like_jax():
    key = jr.key(7)
    a, b = bw.random.split_keys(key)
    c, d = jr.split(key)
    assert _words((a, b)) == _words((c, d))
    # The halves split further, as any key does.
    assert _words(bw.random.split_keys(b, 3)) == _words(jr.split(d, 3))


def test_split_keys_compiles_nothing(count_compiles):
    key = jr.key(0)
    jax.block_until_ready(bw.random.split_keys(key, 2))
    with count_compiles() as ours:
        for num in (53, 59, 61, 67):
            jax.block_until_ready(bw.random.split_keys(key, num))
    assert ours == []
    # ... where the direct calls compile a kernel per `num` (and per unpacking);
    # numbers no other test splits by, so that nothing is cached yet
    with count_compiles() as direct:
        for num in (53, 59, 61, 67):
            jax.block_until_ready(tuple(jr.split(key, num)))
    assert len(direct) >= 4


def test_split_keys_falls_back_inside_jit():
    out = jax.jit(lambda k: jr.key_data(jnp.stack(bw.random.split_keys(k, 4))))(
        jr.key(3)
    )
    assert np.asarray(out).tobytes() == _words(jr.split(jr.key(3), 4))


@pytest.mark.parametrize(
    "dist, draw, direct, bounds",
    [
        (
            "uniform",
            lambda k, s, d: bw.random.uniform(k, s, d, -0.5, 2.0),
            lambda k, s, d, b: jr.uniform(k, s, d, *b),
            (-0.5, 2.0),
        ),
        ("normal", bw.random.normal, lambda k, s, d, b: jr.normal(k, s, d), ()),
        (
            "truncated_normal",
            lambda k, s, d: bw.random.truncated_normal(k, -2.0, 1.5, s, d),
            lambda k, s, d, b: jr.truncated_normal(k, *b, s, d),
            (-2.0, 1.5),
        ),
    ],
    ids=["uniform", "normal", "truncated_normal"],
)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_draws_bit_identical(dist, draw, direct, bounds, dtype, monkeypatch):
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    key = jr.key(11)
    shapes = [(), (1,), (3, 5), (37, 53), (2, 3, 4)]
    # `jax.random`'s draws of every shape in one program, not a compile per
    # shape; the bounds are its arguments, as of `jax.random`'s own (closed
    # over, XLA would fold the truncated normal's `erf` of them into constants
    # an ulp away from what the draw computes)
    direct_draws = jax.jit(lambda key, b: [direct(key, s, dtype, b) for s in shapes])
    for shape, theirs in zip(shapes, direct_draws(key, bounds), strict=True):
        assert_same_draws(draw(key, shape, dtype), theirs, dist)


def test_draws_compile_nothing_per_shape(monkeypatch, count_compiles):
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    key = jr.key(0)
    jax.block_until_ready(bw.random.uniform(key, (2, 2)))
    with count_compiles() as compiles:
        for shape in [(3, 7), (41,), (5, 5, 5), (129, 3)]:
            jax.block_until_ready(bw.random.uniform(key, shape))
    assert compiles == []


def test_int_shape_is_a_vector():
    key = jr.key(2)
    assert bw.random.normal(key, 4).shape == (4,)
    assert _words(bw.random.normal(key, 4)) == _words(jr.normal(key, (4,)))


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda k: bw.random.split_keys(k, 2.0), TypeError, "`num` must be an int"),
        (lambda k: bw.random.split_keys(k, None), TypeError, "got None"),
        (lambda k: bw.random.split_keys(k, True), TypeError, "of type bool"),
        (lambda k: bw.random.split_keys(k, -1), ValueError, "non-negative, got -1"),
        (lambda k: bw.random.uniform(k, (2, -1)), ValueError, r"must not be negative"),
        (lambda k: bw.random.normal(k, "ab"), TypeError, r"^normal: `shape`"),
        (
            lambda k: bw.random.truncated_normal(k, -1.0, 1.0, (2.5,)),
            TypeError,
            r"truncated_normal: `shape` must be an int or a sequence of ints",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call(jr.key(0))
