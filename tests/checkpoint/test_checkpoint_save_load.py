"""`boxwood.save` / `load` / `read_metadata`: names, round trips, validation, errors."""

import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import boxwood
import boxwood.nn as nn

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def same(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert type(x) is type(y)
        if isinstance(x, (jax.Array, np.ndarray)):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
        else:
            assert x == y


@pytest.fixture
def path(tmp_path):
    return tmp_path / "ckpt.safetensors"


def train_state(key):
    model = nn.MLP(4, 3, 8, 2, key=key)
    opt = optax.adam(1e-3)
    opt_state = opt.init(boxwood.filter(model, boxwood.is_array))
    return model, opt_state, jnp.asarray(5)


def test_tensor_names_are_dotted_paths(path, getkey):
    tree = train_state(getkey())
    boxwood.save(path, tree)
    names = set(safetensors_numpy.load_file(path))
    assert "0.layers.0.weight" in names
    assert "1.0.mu.layers.0.bias" in names
    assert "2" in names
    assert len(names) == len(jax.tree.leaves(boxwood.filter(tree, boxwood.is_array)))


def test_round_trip_training_checkpoint(path, getkey):
    tree = train_state(getkey())
    boxwood.save(path, tree, metadata={"step": 5, "lr": 1e-3, "tags": ["a"]})
    like = train_state(getkey())
    loaded = boxwood.load(path, like)
    same(loaded, tree)
    assert boxwood.read_metadata(path) == {"step": 5, "lr": 1e-3, "tags": ["a"]}


def test_load_into_abstract_like(path, getkey):
    tree = train_state(getkey())
    boxwood.save(path, tree)
    like = boxwood.filter_eval_shape(train_state, getkey())
    assert isinstance(like[0].layers[0].weight, jax.ShapeDtypeStruct)
    same(boxwood.load(path, like), tree)


def test_stateful_model_and_state(path, getkey):
    model, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    x = jax.random.normal(getkey(), (8, 3))
    batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    _, state = batched(x, state)
    boxwood.save(path, (model, state))
    like = nn.make_with_state(nn.BatchNorm)(3, "batch")
    model2, state2 = boxwood.load(path, like)
    same(state2.get(model2.state_index), state.get(model.state_index))


def test_low_precision_and_keys_bit_exact(path, getkey):
    tree = {
        "bf16": jax.random.normal(getkey(), (5, 3), jnp.bfloat16),
        "f16": jnp.array([np.nan, -0.0, 65504.0, 6e-8], jnp.float16),
        "key": jax.random.key(3),
        "keys": jax.random.split(jax.random.key(4, impl="rbg"), 3),
        "old_key": jax.random.PRNGKey(1),
        "np_bf16": np.arange(4).astype(jnp.bfloat16),
        "flag": jnp.array([True, False]),
    }
    boxwood.save(path, tree)
    like = jax.tree.map(lambda x: x, tree)
    same(boxwood.load(path, like), tree)
    same(
        boxwood.load(path, jax.eval_shape(lambda: tree)),
        jax.tree.map(jnp.asarray, tree),
    )


def test_key_impl_mismatch_is_reported(path):
    boxwood.save(path, {"k": jax.random.key(0)})
    with pytest.raises(
        boxwood.CheckpointError,
        match="k: file has a PRNG key array of impl 'threefry2x32', model expects a PRNG key array of impl 'rbg'",
    ):
        boxwood.load(path, {"k": jax.random.key(0, impl="rbg")})
    with pytest.raises(
        boxwood.CheckpointError,
        match="k: file has a PRNG key array .*, model expects a plain array",
    ):
        boxwood.load(path, {"k": jnp.zeros(2, jnp.uint32)})


def test_all_problems_reported_at_once(path):
    boxwood.save(
        path,
        {
            "encoder": {"w": jnp.zeros((64, 32)), "b": jnp.zeros(64, jnp.float16)},
            "x": jnp.zeros(1),
        },
    )
    like = {
        "encoder": {"w": jnp.zeros((64, 16)), "b": jnp.zeros(64)},
        "y": jnp.zeros(2),
    }
    with pytest.raises(boxwood.CheckpointError) as info:
        boxwood.load(path, like)
    message = str(info.value)
    assert "(4 problems)" in message
    assert "encoder.w: file has f32[64,32], model expects f32[64,16]" in message
    assert (
        "encoder.b: file has f16[64], model expects f32[64] (pass `dtype=`" in message
    )
    assert "y: missing from the file" in message
    assert "x: in the file but not in the model" in message
    assert "different structure" in message
    assert len(info.value.problems) == 4


def test_dtype_casts_only_when_asked(path):
    boxwood.save(path, {"w": jnp.arange(3.0), "i": jnp.arange(3)})
    like = {"w": jnp.zeros(3, jnp.bfloat16), "i": jnp.zeros(3, jnp.int32)}
    with pytest.raises(
        boxwood.CheckpointError, match=r"w: file has f32\[3\], model expects bf16\[3\]"
    ):
        boxwood.load(path, like)
    out = boxwood.load(path, like, dtype=jnp.bfloat16)
    assert out["w"].dtype == jnp.bfloat16 and out["i"].dtype == jnp.int32
    assert out["w"].tolist() == [0, 1, 2]


def test_non_strict_fills_what_matches(path):
    boxwood.save(path, {"a": jnp.ones(2), "extra": jnp.ones(1)})
    out = boxwood.load(path, {"a": jnp.zeros(2), "b": jnp.zeros(3)}, strict=False)
    assert out["a"].tolist() == [1, 1] and out["b"].tolist() == [0, 0, 0]
    with pytest.raises(
        boxwood.CheckpointError,
        match="b: missing from the file, and `like` has no value",
    ):
        boxwood.load(
            path,
            {"a": jnp.zeros(2), "b": jax.ShapeDtypeStruct((3,), jnp.float32)},
            strict=False,
        )
    with pytest.raises(
        boxwood.CheckpointError, match=r"a: file has f32\[2\], model expects f32\[5\]"
    ):
        boxwood.load(path, {"a": jnp.zeros(5)}, strict=False)


def test_numpy_leaves_stay_numpy_and_code_is_kept(path):
    tree = {"w": np.arange(3.0), "s": np.float32(2.0), "f": jnp.tanh, "n": 3}
    boxwood.save(path, tree)
    assert set(safetensors_numpy.load_file(path)) == {"w", "s"}
    like = {"w": np.zeros(3), "s": np.float32(0), "f": jnp.tanh, "n": 4}
    out = boxwood.load(path, like)
    assert isinstance(out["w"], np.ndarray) and out["w"].tolist() == [0, 1, 2]
    assert isinstance(out["s"], np.float32) and out["s"] == 2
    assert out["f"] is jnp.tanh and out["n"] == 4


def test_interop_with_the_safetensors_library(path, tmp_path):
    arrays = {
        "a.b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "c": np.zeros(0, np.int8),
    }
    other = tmp_path / "other.safetensors"
    safetensors_numpy.save_file(arrays, other, metadata={"k": "v"})
    out = boxwood.load(
        other, {"a": {"b": jnp.zeros((2, 3))}, "c": jnp.zeros(0, jnp.int8)}
    )
    assert out["a"]["b"].tolist() == arrays["a.b"].tolist()
    assert boxwood.read_metadata(other) == {"k": "v"}
    boxwood.save(path, out, metadata={"step": 1})
    back = safetensors_numpy.load_file(path)
    assert back["a.b"].tolist() == arrays["a.b"].tolist() and back["c"].shape == (0,)


def write_bytes(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "content, what",
    [
        (b"", "empty or truncated"),
        (b"\x00" * 5, "empty or truncated"),
        (struct.pack("<Q", 10**9) + b"{}", "does not fit the file"),
        (struct.pack("<Q", 4) + b"nope", "the header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (b"PK\x03\x04 this is a zip file, not safetensors", "does not fit the file"),
    ],
)
def test_bad_files_raise_checkpoint_error(tmp_path, content, what):
    bad = write_bytes(tmp_path / "bad.safetensors", content)
    with pytest.raises(
        boxwood.CheckpointError,
        match=f"bad.safetensors: not a usable safetensors checkpoint: .*{what}",
    ):
        boxwood.load(bad, {"w": jnp.zeros(3)})
    with pytest.raises(boxwood.CheckpointError, match="bad.safetensors"):
        boxwood.read_metadata(bad)


def test_truncated_and_corrupted_data(path):
    boxwood.save(path, {"w": jnp.ones(100), "v": jnp.ones(10)})
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.raises(
        boxwood.CheckpointError,
        match="the file is truncated: its header needs 440 bytes of data, the file has 433",
    ):
        boxwood.load(path, {"w": jnp.zeros(100), "v": jnp.zeros(10)})
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["w"]["shape"] = [99]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    path.write_bytes(data[:8] + text + data[8 + length :])
    with pytest.raises(
        boxwood.CheckpointError, match="tensor 'w': byte range does not match its shape"
    ):
        boxwood.load(path, {"w": jnp.zeros(100), "v": jnp.zeros(10)})


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(
        boxwood.CheckpointError, match="nothing.safetensors: no such checkpoint file"
    ):
        boxwood.load(tmp_path / "nothing.safetensors", {})
    with pytest.raises(FileNotFoundError, match="the directory .* does not exist"):
        boxwood.save(tmp_path / "no" / "x.safetensors", {"w": jnp.ones(1)})


def test_save_rejects_bad_input(path):
    with pytest.raises(
        boxwood.CheckpointError, match="Cannot save `w`: it is an abstract"
    ):
        boxwood.save(path, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    with pytest.raises(TypeError, match="`metadata` must be JSON-serialisable"):
        boxwood.save(path, {"w": jnp.ones(1)}, metadata={"x": jnp.ones(1)})
    with pytest.raises(TypeError, match="`metadata` must be a dict"):
        boxwood.save(path, {"w": jnp.ones(1)}, metadata=[1])
    with pytest.raises(
        boxwood.CheckpointError, match="Two leaves share the checkpoint name 'a.b'"
    ):
        boxwood.save(path, {"a.b": jnp.ones(1), "a": {"b": jnp.ones(1)}})
    with pytest.raises(
        boxwood.CheckpointError,
        match="Cannot save `z`: dtype complex128 cannot be stored in a safetensors file",
    ):
        boxwood.save(path, {"z": np.zeros(2, np.complex128)}, blocking=False)
    with pytest.raises(ValueError, match="`format` must be"):
        boxwood.save(path, {}, format="pickle")
    assert not path.exists()


def test_save_replaces_and_cleans_stale_temporary_files(path):
    boxwood.save(path, {"w": jnp.ones(2)})
    dead = path.parent / f".{path.name}.tmp-999999999-abcd"
    dead.write_bytes(b"half a checkpoint")
    other = path.parent / ".other.safetensors.tmp-999999999-abcd"
    other.write_bytes(b"")
    boxwood.save(path, {"w": jnp.zeros(2)})
    assert not dead.exists() and other.exists()
    assert sorted(os.listdir(path.parent)) == sorted([path.name, other.name])
    assert boxwood.load(path, {"w": jnp.ones(2)})["w"].tolist() == [0, 0]


DTYPES = [np.float32, np.float16, jnp.bfloat16, np.int8, np.uint32, np.bool_, np.int64]


@pytest.fixture(scope="module")
def hypothesis_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hypothesis")


def test_round_trip_property(hypothesis_dir):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    hnp = pytest.importorskip("hypothesis.extra.numpy")

    arrays = st.sampled_from(DTYPES).flatmap(
        lambda dtype: hnp.arrays(
            np.dtype(dtype) if dtype is not jnp.bfloat16 else np.dtype(np.uint16),
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        ).map(lambda a, d=dtype: a.view(d) if d is jnp.bfloat16 else a)
    )
    names = st.text("abc_", min_size=1, max_size=3)
    trees = st.dictionaries(
        names, arrays | st.dictionaries(names, arrays, max_size=2), max_size=4
    )

    @hypothesis.settings(max_examples=25, deadline=None)
    @hypothesis.given(trees)
    def check(tree):
        path = hypothesis_dir / "t.safetensors"
        boxwood.save(path, tree)
        like = jax.tree.map(lambda a: np.zeros_like(a), tree)
        same(boxwood.load(path, like), tree)
        assert set(safetensors_numpy.load_file(path)) == set(boxwood.state_dict(tree))

    check()


def test_loaded_arrays_can_be_donated(path):
    boxwood.save(path, {"w": jnp.arange(1000.0)})
    out = boxwood.load(path, {"w": jnp.zeros(1000)})
    y = jax.jit(lambda x: x * 2, donate_argnums=0)(out["w"])
    assert out["w"].is_deleted() and y[3] == 6
    again = boxwood.load(path, {"w": jnp.zeros(1000)})["w"]
    np.testing.assert_array_equal(again, np.arange(1000.0))


def test_save_starts_the_disk_write_in_chunks(tmp_path, monkeypatch):
    from boxwood._checkpoint import _format, _safetensors

    monkeypatch.setattr(_format, "WRITEBACK_CHUNK", 1000)
    calls = []
    real = _safetensors.start_writeback

    def recording(fd, offset, nbytes):
        calls.append((offset, nbytes))
        real(fd, offset, nbytes)  # the real call, on a real file

    monkeypatch.setattr(_safetensors, "start_writeback", recording)
    tree = {"a": np.arange(700, dtype=np.float32), "b": np.ones(300, np.float64)}
    boxwood.save(tmp_path / "x.safetensors", tree)
    read = safetensors_numpy.load_file(str(tmp_path / "x.safetensors"))
    assert read.keys() == {"a", "b"}
    same(boxwood.load(tmp_path / "x.safetensors", tree), tree)
    data_start = os.path.getsize(tmp_path / "x.safetensors") - 700 * 4 - 300 * 8
    # contiguous ranges of at least a chunk, from the first byte of data on
    assert calls[0][0] == data_start
    for (offset, nbytes), (following, _) in zip(calls, calls[1:]):
        assert offset + nbytes == following
    assert all(nbytes >= 1000 for _, nbytes in calls)
    end = calls[-1][0] + calls[-1][1]
    assert os.path.getsize(tmp_path / "x.safetensors") - end < 1000
