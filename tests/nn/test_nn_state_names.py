"""State keys are named after the index's place in the model: two models built the
same way have equal structures (and share compiled code), while two layers of one
model never share a state entry."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn

leaves = jax.tree_util.tree_leaves
structure = jax.tree_util.tree_structure


class Counter(nn.StatefulLayer):
    index: nn.StateIndex

    def __init__(self):
        self.index = nn.StateIndex(jnp.zeros((), jnp.float32))

    def __call__(self, x, state, *, key=None):
        count = state.get(self.index)
        return x + count, state.set(self.index, count + 1)


class Twins(boxwood.Module):
    """Two layers whose states have identical shapes and initial values."""

    left: Counter
    right: Counter

    def __init__(self):
        self.left = Counter()
        self.right = Counter()

    def __call__(self, x, state):
        x, state = self.left(x, state)
        x, state = self.left(x, state)
        return self.right(x, state)


def test_two_direct_builds_have_equal_structures_and_share_compiled_code():
    @boxwood.filter_jit
    def step(model, state, x):
        return model(x, state)

    first = Twins()
    state1 = nn.State(first)
    second = Twins()
    state2 = nn.State(second)
    assert structure(first) == structure(second)
    assert bool(boxwood.tree_equal(first, second))
    assert structure(state1) == structure(state2)
    step(first, state1, jnp.array(0.0))
    traces = step.cache_info().traces
    y, state2 = step(second, state2, jnp.array(0.0))
    assert step.cache_info().traces == traces
    assert float(y) == 1.0  # left counted 0 then 1; right 0
    assert float(state2.get(second.left.index)) == 2
    assert float(state2.get(second.right.index)) == 1


def test_two_make_with_state_builds_share_compiled_code():
    @boxwood.filter_jit
    def step(model, state, x):
        return model(x, state)

    model1, state1 = nn.make_with_state(Twins)()
    model2, state2 = nn.make_with_state(Twins)()
    step(model1, state1, jnp.array(0.0))
    traces = step.cache_info().traces
    step(model2, state2, jnp.array(0.0))
    assert step.cache_info().traces == traces


def test_identical_layers_of_one_model_have_separate_entries():
    model = Twins()
    state = nn.State(model)
    assert model.left.index.marker != model.right.index.marker
    assert len(leaves(state)) == 2
    _, state = model(jnp.array(0.0), state)
    assert float(state.get(model.left.index)) == 2
    assert float(state.get(model.right.index)) == 1
    state = state.set(model.right.index, jnp.array(7.0))
    assert float(state.get(model.left.index)) == 2
    sub = state.substate(model.right)
    assert len(leaves(sub)) == 1
    _, sub = model.right(jnp.array(0.0), sub)
    state = state.update(sub)
    assert float(state.get(model.right.index)) == 8
    assert float(state.get(model.left.index)) == 2


def test_identical_layers_stay_separate_under_jit_and_after_rebuilds():
    step = boxwood.filter_jit(lambda m, s, x: m(x, s))
    states = []
    for _ in range(2):  # the second build reuses the first one's compiled code
        model = Twins()
        state = nn.State(model)
        for _ in range(3):
            _, state = step(model, state, jnp.array(0.0))
        states.append(state)
    for state in states:
        assert float(state.get(model.left.index)) == 6
        assert float(state.get(model.right.index)) == 3


def test_parts_with_their_own_states_never_share_an_entry():
    left, right = Counter(), Counter()
    left_state, right_state = nn.State(left), nn.State(right)
    assert left.index.marker == right.index.marker  # the same place in each
    pair = (left, right)
    state = nn.State(pair)
    assert len(leaves(state)) == 2
    state = state.set(right.index, jnp.array(5.0))
    assert float(state.get(left.index)) == 0
    assert float(state.get(right.index)) == 5
    # The first part keeps its name (and its own state); the second was renamed.
    assert float(left_state.get(left.index)) == 0
    with pytest.raises(ValueError, match="no entry for the given StateIndex"):
        right_state.get(right.index)


def test_a_path_name_taken_elsewhere_is_not_reused():
    named = Counter()
    nn.State((Counter(), named))  # `named` is now "tuple[1].index"
    fresh = Counter()
    state = nn.State((named, fresh))  # fresh's own path is "tuple[1].index" too
    assert len(leaves(state)) == 2
    assert fresh.index.marker != named.index.marker
    state = state.set(fresh.index, jnp.array(3.0))
    assert float(state.get(named.index)) == 0


def test_one_layer_used_twice():
    layer = Counter()
    state = nn.State((layer, layer))  # one layer: one entry
    assert len(leaves(state)) == 1
    model, state = nn.make_with_state(lambda: (layer, layer))()
    assert len(leaves(state)) == 2  # make_with_state: an entry per place
    state = state.set(model[0].index, jnp.array(4.0))
    assert float(state.get(model[1].index)) == 0


def test_copies_made_before_the_state_share_its_names():
    model = Twins()
    copy = jax.tree_util.tree_map(lambda a: a, model)
    state = nn.State(model)
    y, _ = copy(jnp.array(0.0), state)
    assert float(y) == 1.0


def test_an_index_without_a_state_has_no_entry():
    model = Twins()
    state = nn.State(model)
    other = Twins()
    with pytest.raises(ValueError, match="no entry for the given StateIndex"):
        state.get(other.left.index)
    nn.State(other)  # now named like `model`'s: interchangeable
    assert float(state.get(other.left.index)) == 0


def test_names_survive_pickling_and_unnamed_slots_stay_apart():
    model = Twins()
    nn.State(model)
    again = pickle.loads(pickle.dumps(model))
    assert bool(boxwood.tree_equal(again, model))
    unnamed = pickle.loads(pickle.dumps(Twins()))
    assert unnamed.left.index.marker != unnamed.right.index.marker
    assert structure(unnamed) != structure(Twins())


def test_vmapped_construction_and_substate():
    class Model(boxwood.Module):
        counter: Counter
        many: Counter

        def __init__(self):
            self.counter = Counter()
            self.many = boxwood.filter_vmap(Counter, axis_size=3)()

    model = Model()
    state = nn.State(model)
    sub = state.substate(model.many)
    _, sub = boxwood.filter_vmap(model.many)(jnp.zeros(3), sub)
    state = state.update(sub)
    np.testing.assert_array_equal(state.get(model.many.index), [1, 1, 1])
    assert float(state.get(model.counter.index)) == 0
    assert structure(model) == structure(_named(Model()))


def _named(model):
    nn.State(model)
    return model


def test_substate_of_an_index_without_an_entry():
    model = Twins()
    state = nn.State(model)
    with pytest.raises(ValueError, match="no entry for the given StateIndex"):
        state.substate(Twins())
