"""`tree_serialise_leaves` / `tree_deserialise_leaves`: Equinox's `.eqx` files, both
ways, against the installed equinox (MLP, CNN, attention, BatchNorm)."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as bnn

eqx = pytest.importorskip("equinox")

ATOL = 1e-5


def cnn(lib, key):
    k1, k2 = jax.random.split(key)

    class CNN(lib.Module):
        conv: lib.nn.Conv2d
        pool: lib.nn.MaxPool2d
        head: lib.nn.Linear

        def __init__(self):
            self.conv = lib.nn.Conv2d(1, 4, 3, key=k1)
            self.pool = lib.nn.MaxPool2d(2, 2)
            self.head = lib.nn.Linear(4 * 3 * 3, 5, key=k2)

        def __call__(self, x):
            y = self.pool(jax.nn.relu(self.conv(x)))
            return self.head(y.reshape(-1))

    return CNN()


def attention(lib, key):
    return lib.nn.MultiheadAttention(
        2, 8, use_query_bias=True, use_output_bias=True, key=key
    )


MODELS = {
    "mlp": (lambda lib, key: lib.nn.MLP(3, 2, 8, 2, key=key), (3,)),
    "cnn": (cnn, (1, 8, 8)),
    "attention": (attention, None),
}


def call(model, x):
    if isinstance(model, (eqx.nn.MultiheadAttention, bnn.MultiheadAttention)):
        return model(x, x, x)
    return model(x)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_equinox_file_loads_into_boxwood_model(tmp_path, name):
    make, shape = MODELS[name]
    key = jax.random.key(0)
    x = jax.random.normal(jax.random.key(1), shape or (5, 8))
    theirs = make(eqx, key)
    eqx.tree_serialise_leaves(tmp_path / "model.eqx", theirs)
    ours = boxwood.tree_deserialise_leaves(
        tmp_path / "model.eqx", make(boxwood, jax.random.key(9))
    )
    np.testing.assert_allclose(call(ours, x), call(theirs, x), atol=ATOL)
    # and back: a boxwood file loads into the Equinox model, with Equinox's own
    # filter spec (boxwood writes the scalars Equinox keeps as leaves, e.g. `init`).
    boxwood.tree_serialise_leaves(tmp_path / "back", ours)
    again = eqx.tree_deserialise_leaves(
        tmp_path / "back.eqx", make(eqx, jax.random.key(5))
    )
    np.testing.assert_allclose(call(again, x), call(theirs, x), atol=ATOL)


def test_abstract_like(tmp_path):
    theirs = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", theirs)
    like = boxwood.filter_eval_shape(bnn.MLP, 3, 2, 8, 2, key=jax.random.key(0))
    ours = boxwood.tree_deserialise_leaves(tmp_path / "m.eqx", like)
    assert isinstance(ours.layers[0].weight, jax.Array)
    np.testing.assert_array_equal(ours.layers[1].bias, theirs.layers[1].bias)


def test_batch_norm_model_and_state(tmp_path):
    def run(lib, model, state, x):
        f = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        return f(x, state)

    x = jax.random.normal(jax.random.key(1), (16, 3, 4))
    theirs, their_state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(
        3, "batch", momentum=0.9, mode="ema"
    )
    theirs = eqx.tree_at(
        lambda m: (m.weight, m.bias), theirs, (jnp.arange(3.0) + 1, jnp.arange(3.0))
    )
    for _ in range(3):
        _, their_state = run(eqx, theirs, their_state, x + 2.0)
    eqx.tree_serialise_leaves(tmp_path / "bn.eqx", (theirs, their_state))
    like = bnn.make_with_state(bnn.BatchNorm)(3, "batch", momentum=0.9, mode="ema")
    ours, our_state = boxwood.tree_deserialise_leaves(tmp_path / "bn.eqx", like)
    mean, var = our_state.get(ours.ema_state_index)
    assert not np.allclose(mean, 0)  # the running statistics were loaded
    want, _ = run(eqx, eqx.nn.inference_mode(theirs), their_state, x)
    got, _ = run(boxwood, bnn.inference_mode(ours), our_state, x)
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_layout_mismatch_names_the_leaf(tmp_path):
    eqx.tree_serialise_leaves(
        tmp_path / "m.eqx", eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    )
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`layers.0.weight`: the file's next array \(record 0\) is f32\[8,3\], `like` expects f32\[4,3\]",
    ):
        boxwood.tree_deserialise_leaves(
            tmp_path / "m.eqx", bnn.MLP(3, 2, 4, 2, key=jax.random.key(0))
        )
    mlp = bnn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`1`: the file has no array left for it \(f32\[5\]\)",
    ):
        boxwood.tree_deserialise_leaves(tmp_path / "m.eqx", (mlp, jnp.zeros(5)))
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", (mlp, jnp.ones(5)))
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"The file holds 1 more array\(s\) than `like` has leaves \(the first is f32\[5\]\)",
    ):
        boxwood.tree_deserialise_leaves(tmp_path / "m.eqx", mlp)


def test_bad_files(tmp_path):
    (tmp_path / "bad.eqx").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(
        boxwood.CheckpointError, match="bad.eqx: record 0 is not a NumPy array record"
    ):
        boxwood.tree_deserialise_leaves(tmp_path / "bad", {"w": jnp.zeros(2)})
    with pytest.raises(boxwood.CheckpointError, match="missing.eqx: no such file"):
        boxwood.tree_deserialise_leaves(tmp_path / "missing", {"w": jnp.zeros(2)})


def test_scalars_low_precision_and_keys():
    tree = {
        "bf16": jnp.arange(4, dtype=jnp.bfloat16) / 3,
        "np": np.arange(3, dtype=np.int16),
        "flag": True,
        "lr": 0.5,
        "key": jax.random.key(3),
        "act": jax.nn.relu,
    }
    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(buffer, tree)
    buffer.seek(0)
    like = {
        **tree,
        "bf16": jnp.zeros(4, jnp.bfloat16),
        "flag": False,
        "lr": 0.0,
        "key": jax.random.key(0),
    }
    out = boxwood.tree_deserialise_leaves(buffer, like)
    assert out["bf16"].dtype == jnp.bfloat16
    assert out["bf16"].tobytes() == tree["bf16"].tobytes()
    assert isinstance(out["np"], np.ndarray) and out["np"].tolist() == [0, 1, 2]
    assert out["flag"] is True and out["lr"] == 0.5 and out["act"] is jax.nn.relu
    assert (
        jax.random.key_data(out["key"]).tolist()
        == jax.random.key_data(tree["key"]).tolist()
    )
    buffer.seek(0)
    theirs = eqx.tree_deserialise_leaves(
        buffer,
        {k: v for k, v in like.items() if k != "key"}
        | {"key": jnp.zeros(2, jnp.uint32)},
    )
    assert theirs["bf16"].tobytes() == tree["bf16"].tobytes()


def test_custom_filter_specs():
    tree = (jnp.array([1.0, 2.0]), np.array([4, 5]))
    skip_jax = lambda f, x: (
        None
        if isinstance(x, jax.Array)
        else boxwood.default_serialise_filter_spec(f, x)
    )
    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(buffer, tree, filter_spec=skip_jax)
    buffer.seek(0)
    keep_jax = lambda f, x: (
        x if isinstance(x, jax.Array) else boxwood.default_deserialise_filter_spec(f, x)
    )
    like = (jnp.zeros(2), np.zeros(2, np.int64))
    out = boxwood.tree_deserialise_leaves(buffer, like, filter_spec=keep_jax)
    assert out[0] is like[0] and out[1].tolist() == [4, 5]
    # a pytree of specs, a prefix of the tree
    buffer = io.BytesIO()
    boxwood.tree_serialise_leaves(
        buffer,
        tree,
        filter_spec=(lambda f, x: None, boxwood.default_serialise_filter_spec),
    )
    assert eqx.tree_deserialise_leaves(
        io.BytesIO(buffer.getvalue()), np.zeros(2, np.int64)
    ).tolist() == [4, 5]
    buffer.seek(0)
    wrong = lambda f, x: np.zeros(3)
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"`1`: the file has f64\[3\], `like` expects i64\[2\]",
    ):
        boxwood.tree_deserialise_leaves(
            buffer, (jnp.zeros(2), np.zeros(2, np.int64)), filter_spec=(keep_jax, wrong)
        )
