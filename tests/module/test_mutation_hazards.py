"""A module changed behind boxwood's back never gives a stale `filter_jit` result by
any route that can change it in place: list, dict and NumPy fields are re-read on
every call (such modules never carry a remembered flat form), and the attribute
routes raise (writes through `vars()`/`__dict__` and classes with their own
`__setattr__`: tests/module/test_module_mutation.py). `object.__setattr__` is the one
route that is not detected; docs/filter_jit.md says so and names the fix, which is
tested here. Every check runs after the module has been seen three times
(cold call, remembered flat form, warm call), on both call paths."""

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood._module._flat_form import FLAT
from boxwood._module._slots import instance_dict


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
