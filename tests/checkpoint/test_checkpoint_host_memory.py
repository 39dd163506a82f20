"""The host memory a load reads into (`_checkpoint._host_memory`): large buffers
are private mappings; a load of a file that cannot be mapped reads into one region
whose pages a helper thread faults in; building the abstract model compiles
nothing."""

import ctypes
import gc
import logging
import mmap
import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _safetensors_rewrite import rewrite_in_reverse_order, rewrite_with_8_byte_padding
from boxwood._checkpoint import _host_memory, _safetensors, read_tensors
from boxwood.models import _pretrained

# what a load reads into host memory, and which arrays keep it: on the host's CPU
pytestmark = pytest.mark.usefixtures("host_arrays")

CONFIG = bm.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2)
MiB = 2**20

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/maps"
)


def _kernel_at_least(major, minor):
    try:
        found = tuple(int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


populating_kernel = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _kernel_at_least(5, 14),
    reason="MADV_POPULATE_WRITE needs Linux 5.14",
)


def _model(seed=0):
    return bm.GPT2LMHeadModel(CONFIG, key=jax.random.key(seed))


def _mapping_of(address):
    """`(start, end, permissions, rss_kib)` of this process's mapping holding
    `address`."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        fields = line.split()
        if "-" not in fields[0] or ":" in fields[0]:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            rss = next(ln for ln in lines[i + 1 :] if ln.startswith("Rss:"))
            return start, end, fields[1], int(rss.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def _resident_kib(address, length):
    """KiB of `[address, address + length)` in memory now (`mincore`): only that
    range's pages, where the mapping holding it may have been merged with a
    neighbouring one (its `Rss` then counts the neighbour's pages too)."""
    page = mmap.PAGESIZE
    start = address - address % page
    pages = -(-(address + length - start) // page)
    vector = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(start, pages * page, vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vector) * page // 1024


def _helpers():
    return [t for t in threading.enumerate() if t.name == "boxwood-load-pages"]


@linux_only
def test_large_buffers_are_private_anonymous_mappings():
    # a shared anonymous mapping is shmem: dearer per fault, and never on huge
    # pages where the system keeps shmem off them
    buffer = _host_memory.aligned_empty((_host_memory.OWN_MAPPING,), np.dtype(np.uint8))
    start, end, permissions, _ = _mapping_of(buffer.ctypes.data)
    assert permissions == "rw-p"
    assert buffer.ctypes.data % 64 == 0 and end - start >= buffer.nbytes
    small = _host_memory.aligned_empty((3, 5), np.dtype(np.float32))
    assert small.ctypes.data % 64 == 0 and small.shape == (3, 5)


def test_a_region_hands_out_aligned_disjoint_pieces_until_full():
    region = _host_memory.LoadRegion(1000)

    def take(n):
        piece = region.take(n)
        assert piece is not None
        return piece

    pieces = [take(n) for n in (10, 100, 1)]
    assert [p.ctypes.data % 64 for p in pieces] == [0, 0, 0]
    assert [p.nbytes for p in pieces] == [10, 100, 1]
    ends = [p.ctypes.data + p.nbytes for p in pieces]
    assert all(e <= p.ctypes.data for e, p in zip(ends, pieces[1:]))
    # the next piece starts at 256 (the 1-byte piece sits at 192)
    assert region.take(1000 - 255) is None  # does not fit
    assert take(1000 - 256).ctypes.data == pieces[0].ctypes.data + 256
    region.finish()
    assert not _helpers()


def test_aligned_empty_takes_from_the_active_region_then_falls_back():
    with _host_memory.load_region(_host_memory.OWN_MAPPING):
        region = _host_memory._ACTIVE.get()
        assert region is not None
        first = _host_memory.aligned_empty((4, 4), np.dtype(np.float32))
        assert np.shares_memory(first, region._bytes)
        too_big = _host_memory.aligned_empty(
            (_host_memory.OWN_MAPPING,), np.dtype(np.uint8)
        )
        assert not np.shares_memory(too_big, region._bytes)
        first[...] = 1.0  # writable, as a read needs
    assert _host_memory._ACTIVE.get() is None
    assert not _helpers()
    outside = _host_memory.aligned_empty((4, 4), np.dtype(np.float32))
    assert not np.shares_memory(outside, region._bytes)
    with _host_memory.load_region(_host_memory.OWN_MAPPING - 1):  # too small
        assert _host_memory._ACTIVE.get() is None


@populating_kernel
def test_the_helper_faults_the_region_in_and_finish_returns_the_rest():
    region = _host_memory.LoadRegion(24 * MiB)
    region._helper.join(timeout=60)  # it stops by itself once all is faulted in
    address, length = region._bytes.ctypes.data, 24 * MiB
    assert _resident_kib(address, length) == 24 * 1024  # all resident, none touched
    region.take(MiB + 1)
    region.finish()
    assert _resident_kib(address, length) <= 1024 + 4  # the taken MiB (and a page)


def _recorded_regions(monkeypatch):
    regions = []
    real = _host_memory.LoadRegion.__init__

    def record(self, nbytes):
        real(self, nbytes)
        regions.append(self)

    monkeypatch.setattr(_host_memory.LoadRegion, "__init__", record)
    return regions


def _within(array, region):
    start = region._bytes.ctypes.data
    return start <= array.unsafe_buffer_pointer() < start + region._bytes.size


def _recorded_region_sizes(monkeypatch):
    sizes = []
    real = _host_memory.load_region

    def record(nbytes):
        sizes.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(_safetensors, "load_region", record)
    return sizes


def test_the_region_holds_the_copied_tensors_only(tmp_path, monkeypatch):
    bm.save_pretrained(_model(), tmp_path)
    file = tmp_path / "model.safetensors"
    sizes = _recorded_region_sizes(monkeypatch)
    aligned = read_tensors(file, zero_copy=True)
    copied = [t for t in aligned.values() if not t.mapped]
    assert len(copied) < len(aligned)
    with _safetensors.read_region(aligned.values(), jnp.dtype(np.float32)):
        pass
    with _safetensors.read_region(aligned.values(), jnp.bfloat16):  # a cast: none
        pass
    rewrite_with_8_byte_padding(file)
    unaligned = read_tensors(file, zero_copy=True)
    assert not any(t.mapped for t in unaligned.values())
    with _safetensors.read_region(unaligned.values(), jnp.dtype(np.float32)):
        pass
    rounded = [-(-(t.info.end - t.info.begin) // 64) * 64 for t in copied]
    everything = [
        -(-(t.info.end - t.info.begin) // 64) * 64 for t in unaligned.values()
    ]
    assert sizes == [sum(rounded), 0, sum(everything)]


@linux_only
@pytest.mark.parametrize("why", ["unaligned", "copies asked for"])
def test_a_copying_load_reads_into_one_region(tmp_path, monkeypatch, why):
    monkeypatch.setattr(_host_memory, "OWN_MAPPING", 1024)  # a tiny model's
    model = _model()
    bm.save_pretrained(model, tmp_path)
    file = tmp_path / "model.safetensors"
    if why == "unaligned":
        rewrite_with_8_byte_padding(file)
    else:
        monkeypatch.setenv("BOXWOOD_COPY_CHECKPOINTS", "1")
    regions = _recorded_regions(monkeypatch)
    loaded = bm.from_pretrained(tmp_path)
    assert len(regions) == 1  # sized from the validated reads, serving every one
    arrays = [x for x in jax.tree.leaves(loaded) if isinstance(x, jax.Array)]
    assert all(_within(x, regions[0]) for x in arrays)
    assert _mapping_of(regions[0]._bytes.ctypes.data)[2] == "rw-p"  # private
    assert not _helpers()
    os.unlink(file)
    gc.collect()
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(model)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # a donated piece is written in place at most: its neighbours keep their values
    before = [np.array(x) for x in arrays]
    out = jax.jit(lambda x: x * 2, donate_argnums=0)(arrays[0])
    np.testing.assert_array_equal(out, before[0] * 2)
    for x, y in zip(arrays[1:], before[1:]):
        np.testing.assert_array_equal(np.asarray(x), y)


@linux_only
def test_stacks_of_mapped_layers_out_of_order_get_a_region_of_their_own(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_host_memory, "OWN_MAPPING", 1024)
    model = _model()
    bm.save_pretrained(model, tmp_path)
    rewrite_in_reverse_order(tmp_path / "model.safetensors")
    sizes = _recorded_region_sizes(monkeypatch)
    regions = _recorded_regions(monkeypatch)
    loaded = bm.from_pretrained(tmp_path)
    # every tensor is aligned, but the joined stacks need copies: the one
    # region holds their buffers, nothing else
    assert len(sizes) == len(regions) == 1 and sizes[0] > 1024
    weight = loaded.transformer.h.layers.mlp.c_fc.weight
    assert _within(weight, regions[0])
    assert not _within(loaded.transformer.wte.weight, regions[0])  # mapped
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(model)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_cast_or_a_small_file_loads_without_a_region(tmp_path, monkeypatch):
    model = _model()
    bm.save_pretrained(model, tmp_path)
    rewrite_with_8_byte_padding(tmp_path / "model.safetensors")
    sizes = _recorded_region_sizes(monkeypatch)
    loaded = bm.from_pretrained(tmp_path, dtype=jnp.bfloat16)
    assert sizes == [0]  # one region asked for, none made
    expected = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model)
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_loading_compiles_nothing(tmp_path, caplog):
    # The abstract build makes its key inside the trace: a key made outside it
    # compiled two programs, most of a fresh process's load time.
    bm.save_pretrained(_model(), tmp_path)
    jax.clear_caches()
    _pretrained._clear_abstract_models()
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        bm.from_pretrained(tmp_path)
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert compiled == []


def test_no_region_where_the_device_copies_host_buffers(tmp_path, monkeypatch):
    # an accelerator copies each buffer: kept apart, each is freed once copied,
    # where one region would hold the whole model in host memory until the end
    monkeypatch.setattr(_host_memory, "OWN_MAPPING", 1024)
    model = _model()
    bm.save_pretrained(model, tmp_path)
    rewrite_with_8_byte_padding(tmp_path / "model.safetensors")
    assert _pretrained._adopts_host_buffers()  # the host's CPU (`host_arrays`)
    sizes = _recorded_region_sizes(monkeypatch)
    with jax.default_device(None):  # JAX's own choice of device...
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # ...a GPU
        assert not _pretrained._adopts_host_buffers()
        loaded = bm.from_pretrained(tmp_path)
    assert sizes == []
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(model)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
