"""Equinox's `.eqx` record layout is declared by the layers: a class attribute
`equinox_scalar_fields` names the static fields that Equinox stores as leaves.
Built-in layers declare theirs; a user-defined layer can declare its own."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as bnn

eqx = pytest.importorskip("equinox")


class Scale(boxwood.Module):
    """A boxwood layer whose `factor` is static; Equinox's twin keeps it a leaf."""

    weight: jax.Array
    factor: float = boxwood.field(static=True)
    equinox_scalar_fields = ("factor",)


class PlainScale(boxwood.Module):
    weight: jax.Array
    factor: float = boxwood.field(static=True)


class EqxScale(eqx.Module):
    weight: jax.Array
    factor: float


def saved_by_equinox(tree):
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, tree)
    buffer.seek(0)
    return buffer


def test_a_user_layer_declares_its_scalar_fields_both_ways():
    theirs = (EqxScale(jnp.arange(3.0), 2.5), jnp.ones(2))
    like = (Scale(jnp.zeros(3), 2.5), jnp.zeros(2))
    ours = boxwood.tree_deserialise_leaves(saved_by_equinox(theirs), like)
    np.testing.assert_array_equal(ours[0].weight, theirs[0].weight)
    np.testing.assert_array_equal(ours[1], theirs[1])  # read after `factor`
    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(buffer, ours)
    buffer.seek(0)
    back = eqx.tree_deserialise_leaves(buffer, (EqxScale(jnp.zeros(3), 0.0), like[1]))
    assert back[0].factor == 2.5
    np.testing.assert_array_equal(back[0].weight, theirs[0].weight)


def test_the_declared_field_is_checked_like_a_built_in_one():
    file = saved_by_equinox(EqxScale(jnp.arange(3.0), 2.5))
    with pytest.warns(UserWarning, match=r"`factor`: the file holds 2.5, `like` has"):
        out = boxwood.tree_deserialise_leaves(file, Scale(jnp.zeros(3), 1.0))
    assert out.factor == 1.0


def test_without_the_declaration_the_record_is_not_expected():
    file = saved_by_equinox(EqxScale(jnp.arange(3.0), 2.5))
    with pytest.raises(boxwood.CheckpointError, match=r"1 more array\(s\)"):
        boxwood.tree_deserialise_leaves(file, PlainScale(jnp.zeros(3), 2.5))


def test_the_layout_is_read_from_the_layer_class():
    assert bnn.Dropout.equinox_scalar_fields == ("p", "inference")
    assert bnn.MaxPool2d.equinox_scalar_fields == ("init",)

    class NoRecords(bnn.Dropout):
        equinox_scalar_fields = ()

    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(buffer, (bnn.Dropout(0.5), NoRecords(0.5)))
    assert len(buffer.getvalue()) > 0
    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(buffer, NoRecords(0.5))
    assert buffer.getvalue() == b""


def test_a_malformed_declaration_is_an_error_naming_the_fix():
    class NotATuple(Scale):
        equinox_scalar_fields = "factor"

    class NotAScalar(boxwood.Module):
        weight: jax.Array
        name: str = boxwood.field(static=True)
        equinox_scalar_fields = ("name",)

    with pytest.raises(TypeError, match=r"NotATuple.equinox_scalar_fields must be a"):
        boxwood.tree_serialise_leaves(io.BytesIO(), NotATuple(jnp.zeros(2), 1.0))
    with pytest.raises(
        TypeError,
        match=r"NotAScalar.equinox_scalar_fields names `name`, whose value is 'x'.*"
        r"Remove `name`",
    ):
        boxwood.tree_serialise_leaves(io.BytesIO(), NotAScalar(jnp.zeros(2), "x"))
