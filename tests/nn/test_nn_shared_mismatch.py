"""`Shared` names what differs between the nodes it ties."""

import jax
import jax.numpy as jnp
import pytest

import boxwood.nn as nn


def test_mismatch_names_the_leaf_or_structure():
    a = nn.Linear(3, 4, key=jax.random.key(0))
    b = nn.Linear(3, 4, key=jax.random.key(1))
    with pytest.raises(ValueError, match=r"differ in leaf 0: .*\(4, 3\).*\(4,\)"):
        nn.Shared((a, b), lambda p: p[1].weight, lambda p: p[0].bias)
    with pytest.raises(ValueError, match="differ in structures"):
        nn.Shared((a, b), lambda p: (p[1].weight,), lambda p: [p[0].weight])
    with pytest.raises(ValueError, match="differ in leaf 0"):
        nn.Shared(
            (a, b), lambda p: p[1].weight, lambda p: p[0].weight.astype(jnp.float16)
        )


def test_tied_value_is_computed_abstractly_and_non_array_leaves_compared():
    calls = []

    def get(pair):
        calls.append(type(pair[0].weight).__name__)
        return pair[0].weight.T

    a = nn.Linear(3, 4, key=jax.random.key(0))
    b = nn.Linear(4, 3, key=jax.random.key(1))
    shared = nn.Shared((a, b), lambda p: p[1].weight, get)
    assert calls and all(name != "ArrayImpl" for name in calls[:1])
    assert (shared()[1].weight == a.weight.T).all()
    with pytest.raises(ValueError, match="differ in"):
        nn.Shared(({"n": 1}, {"n": 2}), lambda p: p[1]["n"], lambda p: p[0]["n"])
