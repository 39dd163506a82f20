"""Mutation and aliasing: every way a user can change, share or alias a module, an
array or a container between `filter_jit` calls gives the eager result or a clear
error, on both call paths: modules assigned, copied and shared, arrays written and
donated, containers changed, fields changed in place, and writes after construction
through `__dict__`, `vars()` or around the frozen `__setattr__`."""

import copy
import dataclasses
import json
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood._module._flat_form import FLAT
from boxwood._module._slots import instance_dict


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
    with pytest.raises(
        RuntimeError, match=r"input args\[0\] \(f32\[3\]\) has been deleted or donated"
    ):
        f(x)
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(x)  # as in JAX: the caller gave the buffer away


def test_donated_module_used_again_is_a_clear_error():
    f = bw.filter_jit(_apply, donate="all")
    m = Scale(jnp.arange(3.0))
    f(m, 1.0)
    with pytest.raises(
        RuntimeError, match=r"input args\[0\]\.\w+ .*deleted or donated"
    ):
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


# -------------------------------------------------- fields changed in place
# A module changed behind boxwood's back never gives a stale result by any route
# that can change it in place: list, dict and NumPy fields are re-read on every call
# (such modules never carry a remembered flat form), and the attribute routes raise.
# Every check runs after the module has been seen three times (cold call, remembered
# flat form, warm call).
class Holder(bw.Module):
    value: object

    def __call__(self):
        return sum(
            jnp.sum(jnp.asarray(x, jnp.float32))
            for x in jax.tree_util.tree_leaves(self.value)
        )


def warm(fn, *args):
    for _ in range(3):
        out = fn(*args)
    return out


def _total(module):
    return module()


@pytest.fixture
def total():
    return bw.filter_jit(_total)


def test_a_list_field_mutated_in_place(total):
    module = Holder([jnp.ones(2), jnp.ones(2)])
    assert float(warm(total, module)) == 4
    module.value[0] = jnp.full(2, 5.0)
    assert float(total(module)) == 12
    module.value.append(jnp.ones(3))  # a new structure: traced again
    assert float(total(module)) == 15
    assert FLAT not in instance_dict(module)


def test_a_list_inside_a_tuple_or_a_nested_module(total):
    inner = Holder([jnp.ones(2)])
    module = Holder((jnp.ones(1), inner))
    assert float(warm(total, module)) == 3
    inner.value[0] = jnp.zeros(2)
    assert float(total(module)) == 1
    assert FLAT not in instance_dict(module) and FLAT not in instance_dict(inner)


def test_a_dict_field_mutated_in_place(total):
    module = Holder({"a": jnp.ones(2)})
    assert float(warm(total, module)) == 2
    module.value["a"] = jnp.full(2, 3.0)
    module.value["b"] = jnp.ones(1)
    assert float(total(module)) == 7


@pytest.mark.parametrize("where", ["field", "tuple"])
def test_a_numpy_array_mutated_in_place(total, where):
    array = np.ones(3, np.float32)
    module = Holder(array if where == "field" else (array, jnp.ones(1)))
    expected = 3 if where == "field" else 4
    assert float(warm(total, module)) == expected
    array[0] = 10  # in place, through another name
    assert float(total(module)) == expected + 9
    assert FLAT not in instance_dict(module)


def test_a_numpy_array_in_a_returned_module_is_read_again():
    step = bw.filter_jit(lambda m, x: (m, m() * x))
    array = np.ones(2, np.float32)
    module = Holder((array,))
    _, out = warm(step, module, 1.0)
    assert float(out) == 2
    array[:] = 4
    assert float(step(module, 1.0)[1]) == 8


def test_the_attribute_routes_raise():
    module = Holder(jnp.ones(2))
    with pytest.raises(dataclasses.FrozenInstanceError, match="Holder"):
        module.value = jnp.zeros(2)
    with pytest.raises(dataclasses.FrozenInstanceError, match="Holder"):
        del module.value
    with pytest.raises(dataclasses.FrozenInstanceError, match="Holder"):
        module.value = jnp.zeros(2)


def test_the_documented_ways_to_change_a_module_are_never_stale(total):
    step = bw.filter_jit(lambda m: m)
    module = warm(step, Holder(jnp.ones(2)))  # carries its flat form
    assert FLAT in instance_dict(module)
    assert float(warm(total, module)) == 2
    changed = [
        bw.tree_at(lambda m: m.value, module, jnp.full(2, 3.0)),
        dataclasses.replace(module, value=jnp.full(2, 3.0)),
        jax.tree_util.tree_map(lambda x: x * 3, module),
    ]
    for new in changed:
        assert FLAT not in instance_dict(new)
        assert float(warm(total, new)) == 6
    clone = copy.copy(module)
    assert FLAT not in instance_dict(clone) and float(total(clone)) == 2
    assert float(total(module)) == 2  # the original is unchanged


def test_a_static_field_may_hold_a_list_and_warns_for_arrays():
    # as in Equinox: a list is accepted (lineax keeps operator structures so), with
    # a warning naming the field (it can change in place); an array warns too
    class Config(bw.Module):
        options: object = bw.field(static=True)

    with pytest.warns(UserWarning, match="`Config.options` is a static field holding"):
        assert Config([1, 2]).options == [1, 2]
    with pytest.warns(UserWarning, match="`Config.options` is a static field"):
        Config(np.ones(2))


class Bag(tuple):
    """A tuple subclass with its own flatten, reading a mutable list."""

    def __new__(cls, items):
        self = super().__new__(cls, ())
        self.items = list(items)
        return self


jax.tree_util.register_pytree_node(
    Bag, lambda b: (tuple(b.items), None), lambda _, items: Bag(items)
)


def test_a_tuple_subclass_with_its_own_flatten_is_read_again(total):
    module = Holder(Bag([jnp.ones(2)]))
    assert float(warm(total, module)) == 2
    module.value.items[0] = jnp.full(2, 9.0)  # in place, inside the tuple subclass
    assert float(total(module)) == 18
    assert FLAT not in instance_dict(module)
    # nor does a module returned by `filter_jit` carry one
    step = bw.filter_jit(lambda m: m)
    returned = warm(step, module)
    assert FLAT not in instance_dict(returned)
    returned.value.items[0] = jnp.zeros(2)
    assert float(total(returned)) == 0


def test_namedtuples_still_carry_the_flat_form():
    import optax

    step = bw.filter_jit(lambda m: m)
    state = optax.adam(1e-3).init((jnp.ones(2), jnp.zeros(3)))
    returned = warm(step, Holder(state))
    assert FLAT in instance_dict(returned)  # the fast path is kept for optax states


# ------------------------------------------------ writes through `__dict__`
# Modules changed after construction through their `__dict__`, or through a
# `__setattr__` of their own, are seen; `vars()` of a module returned by a jitted
# call shows its fields.
class M(bw.Module):
    w: jax.Array


class Nested(bw.Module):
    inner: M


def _sum_w(m):
    return m.w.sum()


def test_a_write_to_dict_is_seen():
    f = bw.filter_jit(_sum_w)
    m = M(jnp.zeros(2))
    seen = []
    for i in range(4):
        seen.append(float(f(m)))
        m.__dict__["w"] = jnp.full(2, 2.5 * (i + 1))
    assert seen == [0.0, 5.0, 10.0, 15.0]


def test_a_write_to_a_nested_module_is_seen_through_the_outer_one():
    f = bw.filter_jit(lambda o: o.inner.w.sum())
    o = Nested(M(jnp.zeros(2)))
    seen = []
    for i in range(4):
        seen.append(float(f(o)))
        vars(o.inner)["w"] = jnp.full(2, 2.5 * (i + 1))
    assert seen == [0.0, 5.0, 10.0, 15.0]


def test_a_module_with_its_own_setattr_is_reread_every_call():
    class Mutable(bw.Module):
        w: jax.Array

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)

    f = bw.filter_jit(_sum_w)
    m = Mutable(jnp.zeros(2))
    seen = []
    for i in range(4):
        seen.append(float(f(m)))
        m.w = jnp.full(2, 2.5 * (i + 1))
    assert seen == [0.0, 5.0, 10.0, 15.0]
    nested = bw.filter_jit(lambda t: t[0].w.sum())
    assert float(nested((m,))) == 20.0
    m.w = jnp.ones(2)
    assert float(nested((m,))) == 2.0


def test_vars_of_a_jitted_output_shows_its_fields():
    out = bw.filter_jit(lambda m: jax.tree.map(lambda v: v + 1, m))(
        Nested(M(jnp.zeros(2)))
    )
    fields = vars(out)
    assert list(fields) == ["inner"]  # no `_boxwood_flat` or `_boxwood_rebuild`
    assert float(fields["inner"].w[0]) == 1.0
    assert out.__dict__ == fields


def test_mutating_a_jitted_output_through_its_dict_is_seen():
    step = bw.filter_jit(lambda m: jax.tree.map(lambda v: v + 1, m))
    f = bw.filter_jit(_sum_w)
    out = step(M(jnp.zeros(2)))
    assert float(f(out)) == 2.0
    assert float(f(out)) == 2.0
    out.__dict__["w"] = jnp.full(2, 5.0)
    assert float(f(out)) == 10.0
    assert float(f(step(out))) == 12.0


class Scaled(bw.Module):
    w: jax.Array
    scale: float = bw.field(static=True, default=2.0)


def test_vars_lists_exactly_the_fields_as_for_any_object():
    m = Scaled(jnp.ones(2))
    assert list(vars(m)) == ["w", "scale"]
    assert list(m.__dict__) == ["w", "scale"]
    assert isinstance(vars(m), dict)
    assert json.dumps(sorted(vars(m))) == '["scale", "w"]'
    assert pickle.loads(pickle.dumps(vars(m)))["scale"] == 2.0
    assert type(copy.copy(vars(m))) is dict and type(vars(m).copy()) is dict
    assert Scaled(**vars(m)).scale == 2.0


def test_reading_vars_forgets_nothing(count_flattens):
    f = bw.filter_jit(_sum_w)
    m = M(jnp.ones(2))
    f(m), f(m)
    before = count_flattens["n"]
    for _ in range(3):
        assert list(vars(m)) == ["w"]
        assert float(f(m)) == 2.0
    assert count_flattens["n"] == before  # every call stayed on the fast path


def test_every_dict_method_writes_to_the_module():
    f = bw.filter_jit(lambda m: m.w.sum() * m.scale)
    m = Scaled(jnp.ones(2))
    assert float(f(m)) == 4.0
    vars(m).update(w=jnp.full(2, 3.0))
    assert float(f(m)) == 12.0
    vars(m)["scale"] = 10.0  # a static field: the compiled code follows it
    assert float(f(m)) == 60.0
    vars(m).setdefault("scale", 99.0)  # present: unchanged
    assert float(f(m)) == 60.0
    fields = vars(m)
    fields |= {"w": jnp.zeros(2)}
    assert float(f(m)) == 0.0
    assert vars(m).pop("w") is not None
    with pytest.raises(AttributeError, match="no attribute 'w'"):
        _ = m.w
    vars(m)["w"] = jnp.ones(2)
    del vars(m)["scale"]
    assert Scaled.scale == 2.0 and "scale" not in vars(m)
    with pytest.raises(KeyError, match="scale"):
        del vars(m)["scale"]
    vars(m).clear()
    assert vars(m) == {}


def test_boxwood_entries_cannot_be_written_through_vars():
    m = Scaled(jnp.ones(2))
    with pytest.raises(ValueError, match="`_boxwood_rebuild` is boxwood's own entry"):
        vars(m)["_boxwood_rebuild"] = None
    with pytest.raises(ValueError, match="`_boxwood_flat` is boxwood's own entry"):
        vars(m).update(_boxwood_flat=None)


def test_writes_through_dict_during_init():
    class Direct(bw.Module):
        a: int
        b: jax.Array

        def __init__(self):
            self.__dict__["a"] = 1
            vars(self).update(b=jnp.zeros(2))

    d = Direct()
    assert d.a == 1 and list(vars(d)) == ["a", "b"]
    assert jax.tree.leaves(d)[1].shape == (2,)


def test_replacing_the_whole_dict_is_seen():
    f = bw.filter_jit(lambda m: m.w.sum() * m.scale)
    m = Scaled(jnp.ones(2))
    assert float(f(m)) == 4.0
    object.__setattr__(m, "__dict__", {"w": jnp.ones(2), "scale": 7.0})
    assert float(f(m)) == 14.0
    assert vars(m) == {"w": m.w, "scale": 7.0}


# ----------------------------------------- writes that bypass `__setattr__`
# Writes into a module after construction that bypass its frozen `__setattr__`
# (`object.__setattr__`, `__dict__`, a subclass's own `__setattr__`, a module
# returned by a jitted call): after the module has been passed to `filter_jit`, the
# next call either sees the write (the eager result) or raises an error naming the
# field and the fix (`tree_at`, `dataclasses.replace`).
_FIX = r"(?s)\bw\b.*(tree_at|dataclasses\.replace)"


class Mutable(bw.Module):
    w: jax.Array

    def __setattr__(self, name, value):  # a subclass that allows writes
        object.__setattr__(self, name, value)

    def __call__(self, x):
        return self.w * x


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
