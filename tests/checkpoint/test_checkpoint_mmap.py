"""Zero-copy loading: `from_pretrained` maps a safetensors file and aliases its
64-byte aligned tensors; boxwood's writer aligns every tensor it can; the loaded
arrays outlive the file and never change when boxwood replaces it."""

import gc
import json
import os
import struct
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

import boxwood
import boxwood.models as bm
from _safetensors_rewrite import rewrite_in_reverse_order
from boxwood._checkpoint import CheckpointError, _load_progress, read_tensors

# arrays that alias a file's mapping: on the host's CPU, whatever the backend
pytestmark = pytest.mark.usefixtures("host_arrays")

CONFIG = bm.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2)


def _model(seed=0):
    # in inference mode, as `from_pretrained` returns the models compared with it
    return boxwood.nn.inference_mode(
        bm.GPT2LMHeadModel(CONFIG, key=jax.random.key(seed))
    )


def _header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def _mappings(inode):
    """The address ranges at which this process maps the file of inode `inode`."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if int(fields[4]) == inode and len(fields) == 6:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def _aliased(arrays, path):
    """For each array, whether its buffer lies in a mapping of the file `path`."""
    ranges = _mappings(os.stat(path).st_ino)
    return [any(a <= x.unsafe_buffer_pointer() < b for a, b in ranges) for x in arrays]


def _arrays(model):
    return [x for x in jax.tree.leaves(model) if isinstance(x, jax.Array)]


def _same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/maps"
)


def test_the_writer_aligns_data_and_every_tensor_its_size_allows(tmp_path):
    path = tmp_path / "x.safetensors"
    tree = {
        "odd_f32": np.arange(5, dtype=np.float32),
        "matrix": np.arange(48, dtype=np.float32).reshape(3, 16),
        "bytes": np.arange(3, dtype=np.uint8),
        "half": np.arange(7, dtype=np.float16),
        "bf16": np.ones(64, ml_dtypes.bfloat16),
        "f64": np.arange(3, dtype=np.float64),
        "scalar": np.int32(7),
    }
    boxwood.save(path, tree)
    data_start, header = _header(path)
    assert data_start % 64 == 0
    header.pop("__metadata__")
    assert list(header) == list(boxwood.state_dict(tree))  # in the tree's order
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        itemsize = tree[name].dtype.itemsize
        assert begin % itemsize == 0, name
        if (end - begin) % 64 == 0:
            assert begin % 64 == 0, name
    # the two whole-64-byte tensors first, the rest by decreasing item size
    assert [header[n]["data_offsets"][0] for n in ("bf16", "matrix")] == [0, 128]
    assert header["f64"]["data_offsets"][0] == 320
    read = safetensors_numpy.load_file(str(path))
    assert read.keys() == tree.keys()
    for name, value in tree.items():
        np.testing.assert_array_equal(read[name], value)
        assert read[name].dtype == value.dtype
    loaded = boxwood.load(path, jax.tree.map(np.zeros_like, tree))
    _same(loaded, tree)


@linux_only
def test_aligned_tensors_alias_the_file_mapping(tmp_path):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    file = tmp_path / "model.safetensors"
    data_start, header = _header(file)
    header.pop("__metadata__")
    assert all(e["data_offsets"][0] % 64 == 0 for e in header.values())
    loaded = bm.from_pretrained(tmp_path)
    _same(loaded, model)
    arrays = _arrays(loaded)
    assert arrays and all(_aliased(arrays, file))


@linux_only
def test_a_cast_copies(tmp_path):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    loaded = bm.from_pretrained(tmp_path, dtype=jnp.bfloat16)
    floats = [x for x in _arrays(loaded) if x.dtype == jnp.bfloat16]
    assert floats and not any(_aliased(floats, tmp_path / "model.safetensors"))
    expected = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model)
    _same(loaded, expected)


def _rewrite_with_8_byte_padding(path):
    """The same tensors, their data starting 8 bytes past a 64-byte boundary (as
    the safetensors library pads: 8 bytes only)."""
    data_start, header = _header(path)
    with open(path, "rb") as f:
        f.seek(data_start)
        data = f.read()
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text)) % 64) + 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    assert (8 + len(text)) % 64 == 8


@linux_only
def test_an_unaligned_file_loads_exactly_by_copying(tmp_path):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    file = tmp_path / "model.safetensors"
    _rewrite_with_8_byte_padding(file)
    assert safetensors_numpy.load_file(str(file)).keys()  # still a valid file
    loaded = bm.from_pretrained(tmp_path)
    _same(loaded, model)
    assert not any(_aliased(_arrays(loaded), file))


@linux_only
def test_copies_are_made_when_the_environment_asks(tmp_path, monkeypatch):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    monkeypatch.setenv("BOXWOOD_COPY_CHECKPOINTS", "1")
    loaded = bm.from_pretrained(tmp_path)
    _same(loaded, model)
    assert not any(_aliased(_arrays(loaded), tmp_path / "model.safetensors"))


@linux_only
def test_loaded_arrays_survive_the_file_being_replaced_and_deleted(tmp_path):
    first, second = _model(0), _model(1)
    bm.save_pretrained(first, tmp_path)
    file = tmp_path / "model.safetensors"
    loaded = bm.from_pretrained(tmp_path)
    assert all(_aliased(_arrays(loaded), file))
    inode = os.stat(file).st_ino
    # boxwood's writer renames a new file over the old one: the old inode, which
    # the loaded arrays map, is left as it was
    bm.save_pretrained(second, tmp_path)
    _same(loaded, first)
    _same(bm.from_pretrained(tmp_path), second)
    os.unlink(file)
    gc.collect()
    _same(loaded, first)
    assert _mappings(inode)  # the deleted file's mapping lives on with the arrays
    total = jax.jit(lambda m: sum(jnp.sum(x) for x in _arrays(m)))(loaded)
    assert np.isfinite(float(total))
    del loaded
    # and is released with them (the runtime may free buffers a moment later)
    for _ in range(100):
        gc.collect()
        if not _mappings(inode):
            break
        time.sleep(0.02)
    assert not _mappings(inode)


@linux_only
def test_donating_a_mapped_array_leaves_the_file_alone(tmp_path):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    file = tmp_path / "model.safetensors"
    before = file.read_bytes()
    loaded = bm.from_pretrained(tmp_path)
    array = _arrays(loaded)[0]
    assert _aliased([array], file) == [True]
    expected = np.asarray(array) + 1
    out = jax.jit(lambda x: x + 1, donate_argnums=0)(array)
    np.testing.assert_array_equal(out, expected)
    assert file.read_bytes() == before


def test_a_file_replaced_after_its_header_was_read_is_reported(tmp_path):
    path = tmp_path / "w.safetensors"
    boxwood.save(path, {"w": np.arange(16, dtype=np.float32)})
    for zero_copy in (True, False):
        tensors = read_tensors(path, zero_copy=zero_copy)
        boxwood.save(path, {"w": np.ones(16, np.float32)})
        with pytest.raises(
            CheckpointError, match=r"w.safetensors: the file changed while loading"
        ):
            tensors["w"].read()


def test_zero_copy_reads_are_read_only_views_and_copies_are_not(tmp_path):
    path = tmp_path / "w.safetensors"
    tree = {"a": np.arange(16, dtype=np.float32), "b": np.arange(3, dtype=np.int8)}
    boxwood.save(path, tree)
    mapped = read_tensors(path, zero_copy=True)
    a, b = mapped["a"].read(), mapped["b"].read()
    assert not a.flags.writeable and a.ctypes.data % 64 == 0
    np.testing.assert_array_equal(a, tree["a"])
    np.testing.assert_array_equal(b, tree["b"])
    copied = read_tensors(path)["a"].read()
    assert copied.flags.writeable and copied.ctypes.data % 64 == 0
    # a NumPy leaf loaded from a mapping is the caller's own, writable array
    out = boxwood.load(path, jax.tree.map(np.zeros_like, tree))
    out["a"][0] = 5.0
    assert read_tensors(path)["a"].read()[0] == 0.0


def test_the_progress_bar_shows_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tqdm")
    bm.save_pretrained(_model(), tmp_path)
    monkeypatch.setattr(_load_progress, "MIN_BYTES", 0)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(_load_progress, "watched", lambda: True)
    bars = []
    real = _load_progress._bar
    monkeypatch.setattr(
        _load_progress, "_bar", lambda *a: bars.append(real(*a)) or bars[-1]
    )
    bm.from_pretrained(tmp_path)
    assert "loading" in capsys.readouterr().err
    (bar,) = bars
    size = os.path.getsize(tmp_path / "model.safetensors")
    assert 0.9 * size < bar.total == bar.n < size
    monkeypatch.setattr(_load_progress, "MIN_BYTES", size)
    bm.from_pretrained(tmp_path)
    assert len(bars) == 1 and capsys.readouterr().err == ""


def test_no_progress_bar_in_ci_or_without_tqdm(tmp_path, monkeypatch, capsys):
    bm.save_pretrained(_model(), tmp_path)
    monkeypatch.setattr(_load_progress, "MIN_BYTES", 0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("CI", "true")
    assert not _load_progress.watched()
    monkeypatch.setenv("CI", "")
    assert _load_progress.watched()
    monkeypatch.setattr(_load_progress, "watched", lambda: True)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # not installed
    _same(bm.from_pretrained(tmp_path), bm.from_pretrained(tmp_path))
    assert capsys.readouterr().err == ""


@linux_only
def test_stacked_layers_are_one_mapped_span_when_back_to_back(tmp_path):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    file = tmp_path / "model.safetensors"
    _, header = _header(file)
    first, second = (
        header[f"transformer.h.{i}.mlp.c_fc.weight"]["data_offsets"] for i in (0, 1)
    )
    assert first[1] == second[0]  # boxwood's writer: each parameter's layers in order
    stacked = model.transformer.h.layers.mlp.c_fc.weight
    loaded = bm.from_pretrained(tmp_path)
    assert _aliased([loaded.transformer.h.layers.mlp.c_fc.weight], file) == [True]
    rewrite_in_reverse_order(file)
    loaded = bm.from_pretrained(tmp_path)
    _same(loaded, model)
    weight = loaded.transformer.h.layers.mlp.c_fc.weight
    assert _aliased([weight, loaded.transformer.wte.weight], file) == [False, True]
    np.testing.assert_array_equal(weight, stacked)
