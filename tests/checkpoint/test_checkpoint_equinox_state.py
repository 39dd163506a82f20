"""Stateful layers through Equinox's `.eqx` files: a model trained in Equinox, saved,
loaded into the boxwood model, and trained further in both libraries gives equal
outputs, parameters and states; and back. Every record is matched by position."""

import contextlib
import functools
import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as bnn

eqx = pytest.importorskip("equinox")

ATOL = 1e-5


def make(lib, mode, key):
    """BatchNorm (in `mode`; None is Equinox's default), max pooling, SpectralNorm,
    Dropout and a hand-written `StateIndex` counter, in one model."""
    n = lib.nn
    k1, k2, k3 = jax.random.split(key, 3)

    class Model(lib.Module):
        norm: n.BatchNorm
        pool: n.MaxPool1d
        spectral: n.SpectralNorm
        dropout: n.Dropout
        head: n.Linear
        counter: n.StateIndex

        def __init__(self):
            kwargs = {} if mode is None else {"mode": mode}
            self.norm = n.BatchNorm(3, "batch", momentum=0.8, **kwargs)
            self.pool = n.MaxPool1d(2, 2)
            self.spectral = n.SpectralNorm(n.Linear(12, 6, key=k1), "weight", key=k2)
            self.dropout = n.Dropout(0.25, inference=True)
            self.head = n.Linear(6, 2, key=k3)
            self.counter = n.StateIndex(jnp.array(1.0))

        def __call__(self, x, state):
            x, state = self.norm(x, state)
            x = self.pool(x).reshape(-1)
            x, state = self.spectral(x, state)
            count = state.get(self.counter)
            y = self.head(self.dropout(jnp.tanh(x))) * count
            return y, state.set(self.counter, count * 1.5)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Equinox's note on its default mode
        return n.make_with_state(Model)()


def _step(lib, model, state, x):
    def loss(model, state):
        f = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        y, state = f(x, state)
        return jnp.mean((y - 1.0) ** 2), (y, state)

    grads, (y, state) = lib.filter_grad(loss, has_aux=True)(model, state)
    update = jax.tree.map(lambda g: -0.1 * g, grads)
    return lib.apply_updates(model, update), state, y


def _evaluate(lib, model, state, x):
    model = lib.nn.inference_mode(model)
    f = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    # Equinox's batch mode takes `momentum ** counter` (a float to an int32 array),
    # which strict promotion refuses once traced (eagerly, `jnp.power` takes its
    # concrete-exponent path)
    strict = lib is boxwood
    with contextlib.nullcontext() if strict else jax.numpy_dtype_promotion("standard"):
        return f(x, state)[0]


# Compiled with each library's `filter_jit`: one program per model class (run
# eagerly, every operation of the layers' rules would compile on its own).
@functools.cache
def _jitted(fn, lib):
    return lib.filter_jit(functools.partial(fn, lib))


def step(lib, model, state, x):
    """One SGD step; returns the new model and state and the training output."""
    return _jitted(_step, lib)(model, state, x)


def evaluate(lib, model, state, x):
    return _jitted(_evaluate, lib)(model, state, x)


def batches(n):
    keys = jax.random.split(jax.random.key(7), n)
    return [jax.random.normal(k, (8, 3, 8)) * 2 + 1 for k in keys]


def assert_trees_close(ours, theirs):
    arrays = lambda t: [x for x in jax.tree.leaves(t) if isinstance(x, jax.Array)]
    a, b = arrays(ours), arrays(theirs)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(x, y, atol=ATOL)


BOXWOOD_MODE = {"ema": "ema", "batch": "batch", None: "ema"}


@pytest.mark.parametrize("mode", ["ema", "batch", None], ids=str)
def test_train_in_equinox_continue_in_both(tmp_path, mode):
    xs = batches(5)
    theirs, their_state = make(eqx, mode, jax.random.key(0))
    for x in xs[:3]:
        theirs, their_state, _ = step(eqx, theirs, their_state, x)
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", (theirs, their_state))

    like = make(boxwood, BOXWOOD_MODE[mode], jax.random.key(1))
    ours, our_state = boxwood.tree_deserialise_leaves(tmp_path / "m.eqx", like)
    assert_trees_close(our_state, their_state)  # every state entry, in place
    assert_trees_close(ours, theirs)
    np.testing.assert_allclose(
        evaluate(boxwood, ours, our_state, xs[0]),
        evaluate(eqx, theirs, their_state, xs[0]),
        atol=ATOL,
    )
    for x in xs[3:]:  # training goes on identically
        theirs, their_state, want = step(eqx, theirs, their_state, x)
        ours, our_state, got = step(boxwood, ours, our_state, x)
        np.testing.assert_allclose(got, want, atol=ATOL)
    assert_trees_close(our_state, their_state)
    assert_trees_close(ours, theirs)
    np.testing.assert_allclose(
        evaluate(boxwood, ours, our_state, xs[0]),
        evaluate(eqx, theirs, their_state, xs[0]),
        atol=ATOL,
    )

    # and back: boxwood writes Equinox's layout, scalar leaves included
    boxwood.tree_serialise_leaves(tmp_path / "back.eqx", (ours, our_state))
    again, again_state = eqx.tree_deserialise_leaves(
        tmp_path / "back.eqx", make(eqx, mode, jax.random.key(2))
    )
    assert_trees_close(again_state, their_state)
    np.testing.assert_allclose(
        evaluate(eqx, again, again_state, xs[1]),
        evaluate(eqx, theirs, their_state, xs[1]),
        atol=ATOL,
    )


def test_ema_first_step_flag_is_read_from_its_own_record():
    """The reported case: `inference` must not be read as `ema_first_time_index`."""
    theirs, their_state = make(eqx, "ema", jax.random.key(0))
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, (theirs, their_state))  # not trained yet
    buffer.seek(0)
    like = make(boxwood, "ema", jax.random.key(0))
    ours, our_state = boxwood.tree_deserialise_leaves(buffer, like)
    assert bool(our_state.get(ours.norm.ema_first_time_index)) is True
    x = batches(1)[0]
    theirs, their_state, want = step(eqx, theirs, their_state, x)
    ours, our_state, got = step(boxwood, ours, our_state, x)
    np.testing.assert_allclose(got, want, atol=ATOL)
    np.testing.assert_allclose(
        evaluate(boxwood, ours, our_state, x),
        evaluate(eqx, theirs, their_state, x),
        atol=ATOL,
    )


def test_wrong_mode_is_an_error_naming_the_state_entry(tmp_path):
    theirs, their_state = make(eqx, "ema", jax.random.key(0))
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", (theirs, their_state))
    like = make(boxwood, "torch", jax.random.key(0))
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`1\.Model\.norm\.state_index\.0`: the file's next array \(record 11\) "
        r"is bool\[\], `like` expects f32\[3\].*build `like` with the saved "
        r"layer's mode",
    ):
        boxwood.tree_deserialise_leaves(tmp_path / "m.eqx", like)
    like = make(boxwood, "batch", jax.random.key(0))
    with pytest.raises(boxwood.CheckpointError, match=r"record 11\) is bool\[\]"):
        boxwood.tree_deserialise_leaves(tmp_path / "m.eqx", like)


def test_a_differing_static_scalar_warns_and_keeps_like():
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, eqx.nn.Dropout(0.5))
    buffer.seek(0)
    with pytest.warns(
        UserWarning,
        match=r"`p`: the file holds 0.5, `like` has 0.25\. boxwood keeps this field "
        r"static.*build `like` with p=0.5",
    ):
        out = boxwood.tree_deserialise_leaves(buffer, bnn.Dropout(0.25))
    assert out.p == 0.25


def test_scalar_slot_holding_an_array_is_an_error():
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, jnp.zeros(3))
    buffer.seek(0)
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`p`: Equinox stores this Python scalar as a leaf, but the file's "
        r"record 0 is f32\[3\]",
    ):
        boxwood.tree_deserialise_leaves(buffer, bnn.Dropout(0.25))


def test_files_written_without_scalar_records_still_load():
    """Files from earlier boxwood versions hold only the arrays."""
    model = bnn.Sequential([bnn.Linear(2, 3, key=jax.random.key(0)), bnn.Dropout(0.1)])
    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(
        buffer, model, filter_spec=boxwood.default_serialise_filter_spec
    )
    records = buffer.getvalue()
    only_arrays = io.BytesIO()
    np.save(only_arrays, np.asarray(model.layers[0].weight))
    np.save(only_arrays, np.asarray(model.layers[0].bias))
    assert len(only_arrays.getvalue()) < len(records)  # p, inference were written
    only_arrays.seek(0)
    like = bnn.Sequential([bnn.Linear(2, 3, key=jax.random.key(1)), bnn.Dropout(0.1)])
    out = boxwood.tree_deserialise_leaves(only_arrays, like)
    np.testing.assert_array_equal(out.layers[0].weight, model.layers[0].weight)
