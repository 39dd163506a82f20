"""Host buffers that loaded tensors are read into: `aligned_empty`, and one load's
region (`LoadRegion`), whose pages a helper thread faults in while the load does
other work.

**Why fresh memory is the cost.** Reading a file that is already in the page
cache is a copy; what dominates is the first write to each new page of the
destination (one fault, and the kernel zeroing the page): on the 2-core VM of
the benchmarks about 0.2 s of system time for GPT-2-small's 500 MB in 4 KiB
pages, more than the copy. A load that copies therefore asks for all its memory
at once, as one private anonymous mapping, and has a second thread fault the
pages in (`MADV_POPULATE_WRITE`, from the mapping's end towards its start) while
the first reads the file into the mapping from its start; the two meet
somewhere in the middle. The region is sized once a load knows what it copies:
after validation, from its plans (`_assemble`, `_safetensors.read_region`).

Buffers are private anonymous mappings, never shared ones: Python's
`mmap.mmap(-1, n)` is shared (shmem), which costs more per fault and gets no
transparent huge pages where shmem's are off. Huge pages are not asked for: on
that VM a 2 MiB page is often memory the host has taken back (free page
reporting), and faulting 500 MB in as huge pages took 0.4-0.9 s of system time
against 0.2 s as 4 KiB pages (docs/performance.md, *Pretrained models*).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import mmap
import threading
from collections.abc import Iterator

import numpy as np

from ._format import ALIGNMENT
from ._libc import linux_function

# Buffers at least this large are a private anonymous mapping of their own (page
# aligned, given back to the system as soon as they are freed).
OWN_MAPPING = 4 * 2**20

# `madvise` advice of Linux 5.14 and later: fault every page of a range in
# writable, in one call, without touching the memory from user space.
MADV_POPULATE_WRITE = 23

# The helper thread's step: small enough that it notices within a few
# milliseconds that the reads have caught up with it.
_POPULATE_STEP = 8 * 2**20

_ACTIVE: contextvars.ContextVar[LoadRegion | None] = contextvars.ContextVar(
    "boxwood_load_region", default=None
)


def _private_mapping(nbytes: int) -> mmap.mmap:
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    return mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary.

    XLA's CPU client adopts such host buffers without copying them
    (`jax.device_put(x, may_alias=True)`); NumPy's own allocations are only
    16-byte aligned, which forces a copy. Inside a load that has a `LoadRegion`,
    the array is the next free piece of that region; otherwise a large one is a
    private anonymous mapping of its own (page aligned), which the array keeps
    alive.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    region = _ACTIVE.get()
    raw = region.take(nbytes) if region is not None else None
    if raw is None and nbytes >= OWN_MAPPING:
        raw = np.frombuffer(_private_mapping(nbytes), np.uint8)
    if raw is None:
        spare = np.empty(nbytes + ALIGNMENT, np.uint8)
        start = -spare.ctypes.data % ALIGNMENT
        raw = spare[start : start + nbytes]
    return raw.view(dtype).reshape(shape)


class LoadRegion:
    """`nbytes` of fresh memory handed out in order, each piece 64-byte aligned
    (`take`), while a helper thread faults its pages in from the end.

    Every array taken keeps the whole mapping alive: the region is for the
    tensors of one model, which live and die together. `finish()` stops the
    helper and gives the pages past the last piece taken back to the system.
    """

    def __init__(self, nbytes: int) -> None:
        self._mapping = _private_mapping(max(nbytes, 1))
        self._bytes = np.frombuffer(self._mapping, np.uint8)
        self._used = 0
        self._stop = threading.Event()
        self._helper = threading.Thread(
            target=self._populate, name="boxwood-load-pages", daemon=True
        )
        self._helper.start()

    def take(self, nbytes: int) -> np.ndarray | None:
        """The next `nbytes` of the region, or `None` when they do not fit."""
        start = -(-self._used // ALIGNMENT) * ALIGNMENT
        if start + nbytes > self._bytes.size:
            return None
        self._used = start + nbytes
        return self._bytes[start : start + nbytes]

    def _populate(self) -> None:
        madvise = linux_function(
            "madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
        )
        if madvise is None:
            return
        base, size = self._bytes.ctypes.data, self._bytes.size
        for start in reversed(range(0, size, _POPULATE_STEP)):
            # stop where the reads have got to: they fault their own pages in
            if self._stop.is_set() or start + _POPULATE_STEP <= self._used:
                return
            length = min(_POPULATE_STEP, size - start)
            if madvise(base + start, length, MADV_POPULATE_WRITE) != 0:
                return  # a kernel before 5.14: the reads fault the pages in

    def finish(self) -> None:
        """Stop the helper; return the untaken pages to the system."""
        self._stop.set()
        self._helper.join()
        unused = -(-self._used // mmap.PAGESIZE) * mmap.PAGESIZE
        if unused < len(self._mapping) and hasattr(mmap, "MADV_DONTNEED"):
            self._mapping.madvise(mmap.MADV_DONTNEED, unused)


@contextlib.contextmanager
def load_region(nbytes: int) -> Iterator[None]:
    """Within the block, `aligned_empty` hands out pieces of one `LoadRegion` of
    `nbytes` (falling back to its own buffers once it is used up); nothing for
    a region under `OWN_MAPPING` bytes, or inside the block of another region
    (which goes on serving)."""
    if nbytes < OWN_MAPPING or _ACTIVE.get() is not None:
        yield
        return
    region = LoadRegion(nbytes)
    token = _ACTIVE.set(region)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        region.finish()
