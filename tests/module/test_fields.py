"""Modules' field descriptors (`_module/_instance.py`'s `_Field`): reads, defaults,
missing fields, writes after construction, and reference counts."""

import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood._module import _field_descriptors as _module


@pytest.fixture
def Scale():
    """A module class of this test's own."""

    class Scale(bw.Module):
        w: jax.Array
        k: float = bw.field(static=True, default=1.0)

        def __call__(self, x):
            return self.w * x * self.k

    return Scale


def test_reads_defaults_and_missing_fields(Scale):
    m = Scale(jnp.arange(3.0))
    assert m.k == 1.0 and Scale.k == 1.0
    np.testing.assert_array_equal(m.w, [0.0, 1.0, 2.0])
    with pytest.raises(
        AttributeError, match="type object 'Scale' has no attribute 'w'"
    ):
        Scale.w  # noqa: B018
    bare = object.__new__(Scale)
    with pytest.raises(AttributeError, match="'Scale' object has no attribute 'w'"):
        bare.w  # noqa: B018


def test_a_module_built_from_its_flat_form_fills_its_fields_when_read(Scale):
    out = bw.filter_jit(lambda m: m)(Scale(jnp.arange(3.0), k=2.0))
    np.testing.assert_array_equal(out.w, [0.0, 1.0, 2.0])
    assert out.k == 2.0


def test_writes_after_construction_are_seen(Scale):
    f = bw.filter_jit(lambda m, x: m(x))
    m = Scale(jnp.arange(3.0))
    f(m, 1.0)
    f(m, 1.0)
    object.__setattr__(m, "w", jnp.arange(3.0) * 5)
    np.testing.assert_array_equal(f(m, 1.0), [0.0, 5.0, 10.0])
    object.__setattr__(m, "k", 3.0)
    np.testing.assert_array_equal(f(m, 1.0), [0.0, 15.0, 30.0])
    object.__delattr__(m, "w")
    with pytest.raises(AttributeError, match="w"):
        m.w  # noqa: B018


def test_writes_during_construction_go_to_the_instance_dict(Scale):
    m = Scale(jnp.ones(2), k=4.0)
    assert _module.instance_dict(m)["k"] == 4.0
    with pytest.raises(Exception, match="frozen|Cannot"):
        m.w = jnp.zeros(2)


def test_reads_keep_reference_counts(Scale):
    w = jnp.arange(3.0)
    m = Scale(w)
    gc.collect()
    before = sys.getrefcount(w), sys.getrefcount(m)
    for _ in range(1000):
        m.w  # noqa: B018
        Scale.k  # noqa: B018
    try:
        object.__new__(Scale).w  # noqa: B018
    except AttributeError:
        pass
    gc.collect()
    assert (sys.getrefcount(w), sys.getrefcount(m)) == before


def test_a_field_missing_from_the_dict_asks_the_rules(Scale):
    descriptor = Scale.__dict__["w"]
    m = Scale(jnp.ones(2))
    old = descriptor.name
    descriptor.name = "nope"
    try:
        with pytest.raises(AttributeError, match="nope"):
            m.w  # noqa: B018
    finally:
        descriptor.name = old
    np.testing.assert_array_equal(m.w, [1.0, 1.0])


def test_a_property_standing_in_for_a_field_is_kept_in_subclasses():
    class Base(bw.Module):
        k: int

    class Mid(Base):
        def __init__(self):
            pass  # `k` is the property's

        @property
        def k(self):
            return 7

    class Leaf(Mid):  # inherits the field: its class attribute is Mid's property
        pass

    assert Mid().k == 7
    assert Leaf().k == 7
    assert isinstance(Leaf.__dict__.get("k", Mid.__dict__["k"]), property)


def test_a_field_named_cls_survives_a_rebuild():
    # (`transformers`' BERT masked-LM head is named `cls`)
    class Head(bw.Module):
        cls: jax.Array
        self: int = bw.field(static=True, default=1)

    head = Head(jnp.ones(2))
    again = jax.tree_util.tree_map(lambda x: 2 * x, head)
    assert isinstance(again, Head) and again.self == 1
    np.testing.assert_array_equal(again.cls, [2.0, 2.0])
