import jax
import jax.random as jr
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def getkey():
    """`getkey()` returns a fresh PRNG key each call (deterministic per test)."""
    keys = iter(jr.split(jr.key(0), 10_000))
    return lambda: next(keys)
