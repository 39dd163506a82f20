"""Layer constructors make their constant arrays without compiling anything
(`boxwood._init._const`), and those arrays are the ones `jnp` would make."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood.nn as nn
from boxwood import _init
from boxwood._init import _draw


def _same(a, b):
    assert (a.dtype, a.shape, a.weak_type, a.committed) == (
        b.dtype,
        b.shape,
        b.weak_type,
        b.committed,
    )
    assert a.sharding == b.sharding
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("shape", [3, (2, 3), (), (0,)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32])
def test_ones_zeros_full_match_jnp(shape, dtype):
    _same(_init.ones(shape, dtype), jnp.ones(shape, dtype))
    _same(_init.zeros(shape, dtype), jnp.zeros(shape, dtype))
    _same(_init.full(shape, 7, dtype), jnp.full(shape, 7, dtype))


def test_float64_follows_x64():
    with pytest.warns(UserWarning, match="float64"):
        direct = jnp.ones(2, jnp.float64)
    _same(_init.ones(2, jnp.float64), direct)  # float32 without x64
    with jax.enable_x64(True):
        _same(_init.ones(2, jnp.float64), jnp.ones(2, jnp.float64))


@pytest.mark.parametrize("value", [0, 5, True, False])
def test_scalar_matches_jnp_array(value):
    _same(_init.scalar(value), jnp.array(value))


def test_scalar_rejects_other_values():
    with pytest.raises(TypeError, match="Python bool or int, got 0.5"):
        _init.scalar(0.5)


@pytest.mark.parametrize(
    "make",
    [
        lambda n: nn.LayerNorm((3, n)),
        lambda n: nn.RMSNorm(n),
        lambda n: nn.GroupNorm(1, n),
        lambda n: nn.BatchNorm(n, "batch"),
        lambda n: nn.BatchNorm(n, "batch", mode="batch"),
        lambda n: nn.BatchNorm(n, "batch", mode="ema"),
        lambda n: nn.LSTMCell(7, n, key=jr.key(0)),
        lambda n: nn.GRUCell(n, 5, key=jr.key(1)),
        lambda n: nn.Linear(n, 3, key=jr.key(2)),
    ],
)
def test_constructors_compile_nothing(make, monkeypatch, count_compiles):
    # The first build may compile the shared draw kernel (once per process); a
    # second build with new shapes compiles nothing (`jnp.ones` would compile a
    # kernel per new shape, `jax.random.uniform` one per new shape).
    # (The process-wide count of host-hashed elements starts afresh, so both builds
    # take the same path whatever other tests drew before.)
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    jax.block_until_ready(make(237))
    with count_compiles() as compiles:
        jax.block_until_ready(make(301))
    assert compiles == []


def test_batch_norm_state_matches_jnp():
    # The counter is a weakly typed int, the flag a bool, as `jnp.array` makes them.
    norm, state = nn.make_with_state(nn.BatchNorm)(4, "batch", mode="batch")
    _same(state.get(norm.batch_counter), jnp.array(0))
    norm, state = nn.make_with_state(nn.BatchNorm)(4, "batch", mode="ema")
    _same(state.get(norm.ema_first_time_index), jnp.array(True))
    zeros, also_zeros = state.get(norm.ema_state_index)
    _same(zeros, jnp.zeros(4))
    assert zeros is also_zeros
