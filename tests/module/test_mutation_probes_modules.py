"""Mutation probes for writes into a module after construction that bypass its
frozen `__setattr__` (`object.__setattr__`, `__dict__`, a subclass's own
`__setattr__`, a module returned by a jitted call): after the module has been
passed to `filter_jit`, the next call either sees the write (the eager result)
or raises an error naming the field and the fix (`tree_at`, `dataclasses.replace`).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

_FIX = r"(?s)\bw\b.*(tree_at|dataclasses\.replace)"


class Scale(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x


class Mutable(bw.Module):
    w: jax.Array

    def __setattr__(self, name, value):  # a subclass that allows writes
        object.__setattr__(self, name, value)

    def __call__(self, x):
        return self.w * x


def _apply(m, x):
    return m(x)


def _seen_or_refused(f, m, expected):
    """The eager result, or an error naming the field `w` and the fix."""
    try:
        out = f(m, 1.0)
    except Exception as error:  # noqa: BLE001 - the message is what is checked
        assert re.search(_FIX, str(error)), str(error)
        return
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "write",
    [
        lambda m, v: object.__setattr__(m, "w", v),
        lambda m, v: m.__dict__.__setitem__("w", v),
        lambda m, v: vars(m).update(w=v),
    ],
    ids=["object_setattr", "dict_item", "vars_update"],
)
def test_write_after_the_module_was_seen_twice(write):
    f = bw.filter_jit(_apply)
    m = Scale(jnp.arange(3.0))
    f(m, 1.0)
    f(m, 1.0)  # carries its flat form from here on
    write(m, jnp.arange(3.0) * 5)
    _seen_or_refused(f, m, [0.0, 5.0, 10.0])


def test_subclass_with_its_own_setattr():
    f = bw.filter_jit(_apply)
    m = Mutable(jnp.arange(3.0))
    f(m, 1.0)
    f(m, 1.0)
    m.w = jnp.arange(3.0) * 5
    _seen_or_refused(f, m, [0.0, 5.0, 10.0])


def test_write_into_a_module_returned_by_a_jitted_call():
    f = bw.filter_jit(_apply)
    out = bw.filter_jit(lambda m: m)(Scale(jnp.arange(3.0)))
    object.__setattr__(out, "w", jnp.arange(3.0) * 5)
    _seen_or_refused(f, out, [0.0, 5.0, 10.0])


def test_vars_of_a_returned_module_lists_its_fields():
    built = Scale(jnp.arange(3.0))
    out = bw.filter_jit(lambda m: m)(built)
    assert "w" in vars(out)
    assert list(vars(out)) == list(vars(built))  # as for any other module
    assert list(out.__dict__) == list(built.__dict__)


class Outer(bw.Module):
    inner: Scale
    k: float = bw.field(static=True, default=1.0)

    def __call__(self, x):
        return self.inner(x) * self.k


def test_write_into_a_module_nested_in_one_that_carries_its_flat_form():
    f = bw.filter_jit(_apply)
    m = Outer(Scale(jnp.arange(3.0)))
    f(m, 1.0)
    f(m, 1.0)  # `m` carries its flat form, which holds `inner.w`
    object.__setattr__(m.inner, "w", jnp.arange(3.0) * 5)
    np.testing.assert_array_equal(f(m, 1.0), [0.0, 5.0, 10.0])


def test_write_into_a_static_field_after_construction():
    f = bw.filter_jit(_apply)
    m = Outer(Scale(jnp.arange(3.0)))
    f(m, 1.0)
    f(m, 1.0)
    object.__setattr__(m, "k", 2.0)  # static: part of the compiled program
    np.testing.assert_array_equal(f(m, 1.0), [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(jax.jit(_apply)(m, 1.0), [0.0, 2.0, 4.0])
    # JAX's own flatten carries the new value and a key that follows it
    assert jax.tree_util.tree_structure(m) == jax.tree_util.tree_structure(
        Outer(Scale(jnp.arange(3.0)), k=2.0)
    )


def test_delete_after_construction_then_read():
    m = Scale(jnp.arange(3.0))
    f = bw.filter_jit(_apply)
    f(m, 1.0)
    f(m, 1.0)
    object.__delattr__(m, "w")
    with pytest.raises(AttributeError, match="w"):
        m.w  # noqa: B018
    with pytest.raises(AttributeError, match="w"):
        object.__delattr__(m, "w")


def test_writes_during_construction_keep_the_fast_path(count_flattens):
    """Fields set in `__init__` (also through `object.__setattr__`, as some Equinox
    code does) are construction, not a change: they forget no cached flat form."""

    class Built(bw.Module):
        w: jax.Array

        def __init__(self, w):
            object.__setattr__(self, "w", w)

    f = bw.filter_jit(_apply)
    m = Scale(jnp.arange(3.0))
    f(m, 1.0)
    f(m, 1.0)
    before = count_flattens["n"]
    Built(jnp.ones(3))
    bw.nn.inference_mode(bw.nn.Dropout(0.5))
    f(m, 1.0)
    assert count_flattens["n"] == before
