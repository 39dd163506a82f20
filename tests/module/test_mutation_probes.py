"""Mutation and aliasing probes: every way a user can change, share or alias a
module, an array or a container between `filter_jit` calls gives the eager result
or a clear error. (Writes into a module after construction that bypass
`__setattr__` are in `test_mutation_probes_modules.py`.)"""

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw


class Scale(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x


class Stack(bw.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _apply(m, x):
    return m(x)


def _warm(f, *args):
    f(*args)
    return f(*args)  # a module seen twice carries its flat form from here on


# ------------------------------------------------------------------ modules
@pytest.mark.parametrize(
    "write",
    [
        lambda m: setattr(m, "w", jnp.zeros(3)),
        lambda m: m.__setattr__("w", jnp.zeros(3)),
        lambda m: delattr(m, "w"),
    ],
    ids=["setattr", "dunder_setattr", "delattr"],
)
def test_assigning_a_field_raises_naming_the_field_and_the_fix(write):
    m = Scale(jnp.arange(3.0))
    _warm(bw.filter_jit(_apply), m, 1.0)
    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"(?s)`Scale\.w`.*immutable.*tree_at"
    ):
        write(m)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: bw.tree_at(lambda t: t.w, m, jnp.arange(3.0) * 5),
        lambda m: dataclasses.replace(m, w=jnp.arange(3.0) * 5),
        lambda m: jax.tree_util.tree_map(lambda a: a * 5, m),
        lambda m: copy.copy(bw.tree_at(lambda t: t.w, m, jnp.arange(3.0) * 5)),
    ],
    ids=["tree_at", "replace", "tree_map", "copy"],
)
def test_modified_copies_are_seen(edit):
    f = bw.filter_jit(_apply)
    m = Scale(jnp.arange(3.0))
    _warm(f, m, 1.0)
    new = edit(m)
    np.testing.assert_array_equal(f(new, 1.0), [0.0, 5.0, 10.0])
    np.testing.assert_array_equal(f(m, 1.0), [0.0, 1.0, 2.0])  # the old is unchanged


def test_list_field_changed_in_place_is_seen():
    f = bw.filter_jit(_apply)
    m = Stack([Scale(jnp.full(3, 2.0))])
    np.testing.assert_array_equal(_warm(f, m, jnp.ones(3)), [2.0, 2.0, 2.0])
    m.layers.append(Scale(jnp.full(3, 3.0)))
    np.testing.assert_array_equal(f(m, jnp.ones(3)), [6.0, 6.0, 6.0])
    m.layers[0] = Scale(jnp.full(3, -1.0))
    np.testing.assert_array_equal(f(m, jnp.ones(3)), [-3.0, -3.0, -3.0])


def test_numpy_field_written_in_place_is_seen():
    f = bw.filter_jit(_apply)
    m = Scale(np.arange(3.0, dtype=np.float32))
    np.testing.assert_array_equal(_warm(f, m, 1.0), [0.0, 1.0, 2.0])
    m.w[0] = 7.0
    np.testing.assert_array_equal(f(m, 1.0), [7.0, 1.0, 2.0])


def test_same_module_twice_in_one_call_and_in_a_tuple():
    f = bw.filter_jit(lambda a, b: a(1.0) + b(2.0))
    g = bw.filter_jit(lambda pair: pair[0](1.0) - pair[1](1.0))
    m = Scale(jnp.arange(3.0))
    for _ in range(3):
        np.testing.assert_array_equal(f(m, m), [0.0, 3.0, 6.0])
        np.testing.assert_array_equal(g((m, m)), [0.0, 0.0, 0.0])
    other = Scale(jnp.ones(3))
    np.testing.assert_array_equal(f(m, other), [2.0, 3.0, 4.0])  # no longer aliased


# ------------------------------------------------------------------ arrays
def test_numpy_argument_written_in_place_is_seen():
    f = bw.filter_jit(lambda a: a * 2)
    a = np.arange(3.0, dtype=np.float32)
    f(a)
    a[1] = 10.0
    np.testing.assert_array_equal(f(a), [0.0, 20.0, 4.0])


def test_numpy_view_sees_its_base_written():
    f = bw.filter_jit(lambda a: a * 2)
    base = np.arange(6.0, dtype=np.float32)
    view = base[::2]
    np.testing.assert_array_equal(f(view), [0.0, 4.0, 8.0])
    base[0] = 100.0
    np.testing.assert_array_equal(f(view), [200.0, 4.0, 8.0])
    view[2] = -1.0  # a write through the view
    np.testing.assert_array_equal(f(view), [200.0, 4.0, -2.0])


GLOBAL_NP = np.arange(3.0, dtype=np.float32)


def test_captured_numpy_global_written_in_place_is_seen():
    f = bw.filter_jit(lambda x: GLOBAL_NP * x)
    np.testing.assert_array_equal(f(1.0), [0.0, 1.0, 2.0])
    GLOBAL_NP[0] = 9.0
    try:
        np.testing.assert_array_equal(f(1.0), [9.0, 1.0, 2.0])
    finally:
        GLOBAL_NP[0] = 0.0


def test_same_array_twice_in_one_call():
    f = bw.filter_jit(lambda a, b: a * b)
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(f(x, x), [0.0, 1.0, 4.0])
    np.testing.assert_array_equal(f((x), jnp.ones(3)), [0.0, 1.0, 2.0])


def test_same_array_twice_donated_is_a_clear_error():
    f = bw.filter_jit(lambda a, b: a + b, donate="all")
    x = jnp.ones(3)
    with pytest.raises(Exception, match=r"previously donated in the same call"):
        f(x, x)
    np.testing.assert_array_equal(f(jnp.ones(3), jnp.ones(3)), [2.0, 2.0, 2.0])


def test_donated_buffer_used_again_is_a_clear_error():
    f = bw.filter_jit(lambda a: a + 1, donate="all")
    x = jnp.ones(3)
    f(x)
    assert x.is_deleted()
    with pytest.raises(Exception, match=r"deleted or donated|has been deleted"):
        f(x)
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(x)  # as in JAX: the caller gave the buffer away


def test_donated_module_used_again_is_a_clear_error():
    f = bw.filter_jit(_apply, donate="all")
    m = Scale(jnp.arange(3.0))
    f(m, 1.0)
    with pytest.raises(Exception, match=r"deleted or donated|has been deleted"):
        f(m, 1.0)


def test_not_donating_the_first_argument_keeps_the_model():
    f = bw.filter_jit(_apply, donate="all-except-first")
    m = Scale(jnp.arange(3.0))
    for _ in range(3):
        np.testing.assert_array_equal(f(m, jnp.ones(3)), [0.0, 1.0, 2.0])


# ------------------------------------------------------------------ containers
def test_dict_and_list_arguments_changed_between_calls():
    f = bw.filter_jit(lambda d: sum(d[k] for k in sorted(d)))
    d = {"a": jnp.ones(2)}
    np.testing.assert_array_equal(f(d), [1.0, 1.0])
    d["b"] = jnp.full(2, 2.0)
    np.testing.assert_array_equal(f(d), [3.0, 3.0])
    g = bw.filter_jit(lambda xs: xs[0] * len(xs))
    xs = [jnp.ones(2)]
    g(xs)
    xs.append(jnp.ones(2))
    np.testing.assert_array_equal(g(xs), [2.0, 2.0])


def test_mutating_outputs_does_not_change_the_next_call():
    f = bw.filter_jit(lambda a: [a, {"k": a, "s": {1, 2}}])
    out = f(jnp.ones(2))
    out.append(1)
    out[1]["z"] = 2
    out[1]["s"].add(3)
    again = f(jnp.ones(2))
    assert len(again) == 2 and set(again[1]) == {"k", "s"} and again[1]["s"] == {1, 2}


def test_output_module_fed_back_and_modified_by_tree_at():
    f = bw.filter_jit(lambda m: bw.tree_at(lambda t: t.w, m, m.w + 1))
    m = Scale(jnp.zeros(3))
    for i in range(1, 4):
        m = f(m)
        np.testing.assert_array_equal(m.w, [float(i)] * 3)
    m = bw.tree_at(lambda t: t.w, m, jnp.full(3, -10.0))
    np.testing.assert_array_equal(f(m).w, [-9.0] * 3)


# ------------------------------------------------------------------ statics
def test_equal_statics_of_other_types_compile_separately():
    # deliberately unlike `jax.jit`, which reuses the first program for `1.0`
    f = bw.filter_jit(lambda s: jnp.asarray(s))
    assert f(1).dtype == jnp.asarray(1).dtype
    assert f(1.0).dtype == jnp.asarray(1.0).dtype
    assert f(True).dtype == jnp.asarray(True).dtype
    assert f.cache_info().traces == 3
    g = bw.filter_jit(lambda s: 1 / jnp.asarray(s))
    assert float(g(0.0)) == float("inf") and float(g(-0.0)) == float("-inf")
