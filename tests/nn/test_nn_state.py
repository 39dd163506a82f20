import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn


class Counter(nn.StatefulLayer):
    index: nn.StateIndex

    def __init__(self, start=0):
        self.index = nn.StateIndex(jnp.array(start, jnp.float32))

    def __call__(self, x, state, *, key=None):
        count = state.get(self.index)
        return x + count, state.set(self.index, count + 1)


class Pair(boxwood.Module):
    first: Counter
    second: Counter

    def __init__(self):
        self.first = Counter(0)
        self.second = Counter(10)

    def __call__(self, x, state):
        x, state = self.first(x, state)
        return self.second(x, state)


def test_make_with_state_collects_initial_values():
    model, state = nn.make_with_state(Pair)()
    assert float(state.get(model.first.index)) == 0
    assert float(state.get(model.second.index)) == 10
    y, state = model(jnp.array(1.0), state)
    assert float(y) == 11
    assert float(state.get(model.first.index)) == 1
    assert float(state.get(model.second.index)) == 11


def test_init_is_removed_from_model_arrays():
    raw = Pair()
    assert len(jax.tree_util.tree_leaves(raw)) == 2  # the two initial values
    model, state = nn.make_with_state(Pair)()
    assert jax.tree_util.tree_leaves(model) == []
    assert len(jax.tree_util.tree_leaves(state)) == 2


def test_markers_name_the_path_so_two_builds_are_compatible():
    model1, state1 = nn.make_with_state(Pair)()
    model2, state2 = nn.make_with_state(Pair)()
    assert model1.first.index.marker == "Pair.first.index"
    assert jax.tree_util.tree_structure(state1) == jax.tree_util.tree_structure(state2)
    # model2 works with state1.
    y, _ = model2(jnp.array(0.0), state1)
    assert float(y) == 10


def test_state_is_a_pytree_with_keys():
    model, state = nn.make_with_state(Pair)()
    doubled = jax.tree_util.tree_map(lambda a: 2 * a, state)
    assert float(doubled.get(model.second.index)) == 20
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)
    ]
    assert paths == ["['Pair.first.index']", "['Pair.second.index']"]


def test_state_under_jit():
    model, state = nn.make_with_state(Pair)()
    step = jax.jit(lambda x, state: model(x, state))
    for _ in range(3):
        y, state = step(jnp.array(0.0), state)
    assert float(y) == 2 + 12  # third step: counters at 2 and 12
    assert float(state.get(model.first.index)) == 3


def test_state_under_vmap_and_scan():
    model, state = nn.make_with_state(Pair)()
    batched = jax.vmap(model, in_axes=(0, None), out_axes=(0, None))
    ys, state = batched(jnp.arange(3.0), state)
    np.testing.assert_allclose(ys, [10, 11, 12])

    def body(state, x):
        y, state = model(x, state)
        return state, y

    state, ys = jax.lax.scan(body, state, jnp.zeros(4))
    np.testing.assert_allclose(ys, [12, 14, 16, 18])


def test_set_returns_new_state_and_retires_old():
    model, state = nn.make_with_state(Counter)()
    new = state.set(model.index, jnp.array(5.0))
    assert float(new.get(model.index)) == 5
    with pytest.raises(ValueError, match="out of date"):
        state.get(model.index)
    with pytest.raises(ValueError, match="out of date"):
        jax.tree_util.tree_leaves(state)
    assert "retired" in repr(state)


def test_copy_of_state_survives_set():
    model, state = nn.make_with_state(Counter)()
    copy = jax.tree_util.tree_map(lambda a: a, state)
    state.set(model.index, jnp.array(5.0))
    assert float(copy.get(model.index)) == 0


def test_set_checks_structure_shape_and_dtype():
    model, state = nn.make_with_state(Counter)()
    with pytest.raises(ValueError, match="same structure, shapes and dtypes"):
        state.set(model.index, jnp.zeros(3))
    with pytest.raises(ValueError, match="same structure, shapes and dtypes"):
        state.set(model.index, jnp.array(1, jnp.int32))
    with pytest.raises(ValueError, match="same structure, shapes and dtypes"):
        state.set(model.index, (jnp.array(1.0),))


def test_get_rejects_non_index_and_unknown_index():
    model, state = nn.make_with_state(Counter)()
    with pytest.raises(ValueError, match="must be `boxwood.nn.StateIndex`"):
        state.get("Counter.index")
    other, _ = nn.make_with_state(Pair)()
    with pytest.raises(ValueError, match="no entry for the given StateIndex"):
        state.get(other.first.index)


def test_state_constructor_and_deleted_init():
    raw = Counter(3)
    state = nn.State(raw)
    assert float(state.get(raw.index)) == 3
    model, _ = nn.make_with_state(Counter)()
    with pytest.raises(ValueError, match="already moved into a State"):
        nn.State(model)
    stripped = nn.delete_init_state(raw)
    assert jax.tree_util.tree_leaves(stripped) == []
    assert stripped.index.marker is raw.index.marker


def test_state_index_rejects_function():
    with pytest.raises(ValueError, match="initial value of the state itself"):
        nn.StateIndex(lambda: jnp.zeros(3))


def test_state_index_holds_any_pytree():
    index = nn.StateIndex({"a": jnp.zeros(2), "b": (jnp.ones(()),)})
    state = nn.State(index)
    assert jax.tree_util.tree_structure(
        state.get(index)
    ) == jax.tree_util.tree_structure({"a": 0, "b": (0,)})


def test_substate_and_update():
    model, state = nn.make_with_state(Pair)()
    sub = state.substate(model.second)
    assert len(jax.tree_util.tree_leaves(sub)) == 1
    _, sub = model.second(jnp.array(0.0), sub)
    state = state.update(sub)
    assert float(state.get(model.second.index)) == 11
    assert float(state.get(model.first.index)) == 0
    with pytest.raises(ValueError, match="takes a State"):
        state.update({})
    foreign = nn.State(Counter())
    with pytest.raises(ValueError, match="has an entry this State lacks"):
        state.update(foreign)


def test_repr():
    model, state = nn.make_with_state(Counter)()
    assert repr(state) == "State('Counter.index': f32[])"


def test_stateful_layer_defaults_and_is_abstract():
    assert Counter().is_stateful()

    class NoCall(nn.StatefulLayer):
        pass

    with pytest.raises(TypeError, match="__call__"):
        NoCall()
