"""A mutable container among the non-array outputs of a `filter_jit` function is a
new object on every call: static output leaves that are Python's own mutable
containers (a `set`, a `bytearray`, a `Counter`) are copied (`copy.copy`) by the
output builder, on the C and the Python path alike; anything else (numbers,
strings, functions, jitted functions, the user's own objects) is returned as it is,
as JAX and Equinox return it."""

import enum
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood._module._flat_build import is_immutable_value


class Counter:
    def __init__(self):
        self.n = 0


class Colour(enum.Enum):
    RED = 1


def test_a_mutated_set_output_does_not_leak_into_the_next_call():
    f = bw.filter_jit(lambda x: (x, {1, 2}))
    first = f(jnp.ones(1))
    first[1].add(99)
    assert f(jnp.ones(1))[1] == {1, 2}


def test_a_bytearray_and_a_counter_are_fresh_on_every_call():
    import collections

    f = bw.filter_jit(
        lambda x: {"x": x, "n": collections.Counter("ab"), "b": bytearray(b"ab")}
    )
    a = f(jnp.ones(1))
    a["n"]["a"] += 5
    a["b"][0] = 0
    b = f(jnp.ones(1))
    assert b["n"] == collections.Counter("ab") and b["n"] is not a["n"]
    assert b["b"] == bytearray(b"ab")


def test_user_objects_and_functions_are_returned_as_they_are():
    # the same object on every call (documented in docs/filter_jit.md, *Outputs*)
    counter = Counter()
    f = bw.filter_jit(lambda x: (x, counter, jnp.tanh, jax.nn.relu))
    a, b = f(jnp.ones(1)), f(jnp.ones(1))
    assert a[1] is counter and b[1] is counter
    assert a[2] is jnp.tanh and b[2] is jnp.tanh and b[3] is jax.nn.relu


def test_a_lone_static_output_is_fresh_too():
    f = bw.filter_jit(lambda x: {3})  # no array in the output at all
    a = f(jnp.ones(1))
    a.add(4)
    assert f(jnp.ones(1)) == {3}


def test_a_mutable_output_below_the_builders_depth_limit_is_fresh():
    def deep(x):
        out = [{"s"}]
        for _ in range(80):  # deeper than `_flat_build._MAX_DEPTH`: plain unflatten
            out = [out]
        return x, out

    f = bw.filter_jit(deep)
    a = f(jnp.ones(1))
    inner = a[1]
    while isinstance(inner, list):
        inner = inner[0]
    inner.add("t")
    inner = f(jnp.ones(1))[1]
    while isinstance(inner, list):
        inner = inner[0]
    assert inner == {"s"}


def test_immutable_static_outputs_are_the_same_object_on_every_call():
    shared = (frozenset({1, 2}), "name", Colour.RED, np.dtype("int8"), jnp.float32)
    f = bw.filter_jit(lambda x: (x, *shared))
    a, b = f(jnp.ones(1)), f(jnp.ones(1))
    assert all(x is y for x, y in zip(a[1:], b[1:]))


def test_an_object_that_cannot_be_copied_is_returned_as_it_is():
    lock = threading.Lock()
    f = bw.filter_jit(lambda x: (x, lock))
    assert f(jnp.ones(1))[1] is lock and f(jnp.ones(1))[1] is lock


def test_list_and_dict_outputs_are_fresh_objects():
    f = bw.filter_jit(lambda x: (x, [1], {"k": [2]}))
    a, b = f(jnp.ones(1)), f(jnp.ones(1))
    assert a[1] is not b[1] and a[2] is not b[2] and a[2]["k"] is not b[2]["k"]


@pytest.mark.parametrize(
    "value, immutable",
    [
        (1, True), ("s", True), (None, True), (frozenset({1}), True),
        (frozenset({Counter()}), False), ({1}, False), (bytearray(), False),
        (Counter(), False), (Colour.RED, True), (np.dtype("float32"), True),
        (object(), True), (jnp.float32, True), (jax.sharding.PartitionSpec("x"), True),
    ],
)  # fmt: skip
def test_is_immutable_value(value, immutable):
    assert is_immutable_value(value) is immutable
