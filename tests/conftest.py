import contextlib
import gc
import os

from _child_flags import (  # tests/ is on sys.path; no JAX
    quick_cpu_compiles,
    share_cores_among_workers,
)

quick_cpu_compiles()  # before JAX starts its backend (below)
share_cores_among_workers()  # before JAX sizes its thread pool (below)
# PyTorch at one thread (its OpenMP pool's size is read when a test module first
# imports torch; child processes inherit it). The suite's reference models are
# tiny: one thread computes each operation in microseconds, where a thread per
# core spends most of its CPU starting and waiting on threads (a 20-token
# attention took about 1 ms of CPU on 2 threads, 45 us on one), and two xdist
# workers share two cores, so idle pool threads spin on the core the other
# worker is using (the PyTorch comparisons of tests/nn took about 8% less CPU,
# measured on a loaded machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.random as jr  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

ON_CPU = jax.default_backend() == "cpu"
if not ON_CPU:
    # The suite checks that a failed `error_if` raises from the call, as on the
    # CPU; off it `filter_jit` calls return before they run unless told to wait
    # (tests/backends/test_backend_portability.py checks the asynchronous path itself).
    os.environ.setdefault("BOXWOOD_SYNC_CHECKS", "1")


@pytest.fixture(autouse=True)
def _full_float32_products_off_the_cpu():
    """The suite's float32 tolerances were measured on the CPU, whose matrix
    products are full float32; a TPU's or GPU's default rounds their operands
    (bfloat16 or TF32). Off the CPU every test runs at `highest` precision; on
    the CPU this fixture does nothing (the programs compiled there are unchanged)."""
    if ON_CPU:
        yield
        return
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture
def host_arrays():
    """The test with the host's CPU as JAX's default device, whatever the backend:
    for what exists only where arrays live in host memory (a device adopting a
    host buffer, an array aliasing a file's mapping). On the CPU it does nothing."""
    if ON_CPU:
        yield
        return
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        yield


@pytest.fixture(autouse=True)
def _fresh_method_read_warnings():
    """Each test sees boxwood's once-per-process warnings about globals read inside
    methods (`_jit/_capture/_arguments.py`) as a fresh process would, whatever ran
    before it on the same worker."""
    from boxwood._jit._capture import _arguments

    _arguments._WARNED.clear()
    yield


@pytest.fixture(autouse=True)
def _small_gc_heap(request):
    """In a test module that calls `gc.collect()` (it imports `gc`): collect, then
    freeze what survives, so that the test's own collections walk only the objects
    it makes, not everything every earlier test on this worker left in JAX's
    caches (a full collection late in a run takes about a second). Frozen objects
    stay alive; nothing a test makes is frozen before it ends."""
    if getattr(request.module, "gc", None) is gc:
        gc.collect()
        gc.freeze()
    yield


@pytest.fixture
def getkey():
    """`getkey()` returns a fresh PRNG key each call (deterministic per test)."""
    keys = iter(jr.split(jr.key(0), 10_000))
    return lambda: next(keys)


@pytest.fixture
def count_flattens(monkeypatch):
    """`count_flattens["n"]`: how many times `filter_jit` flattened its arguments
    (its slow path) since the fixture was set up."""
    from boxwood._jit import _dispatch

    calls = {"n": 0}
    real = _dispatch._flatten

    def counting(tree, *a, **k):
        calls["n"] += 1
        return real(tree, *a, **k)

    monkeypatch.setattr(_dispatch, "_flatten", counting)
    return calls


# The `jax.monitoring` event of one XLA compile.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture
def count_compiles():
    """`with count_compiles() as events:` lists XLA compiles (one entry each) made
    inside the block."""

    @contextlib.contextmanager
    def counting():
        events = []

        def listen(event, duration, **kwargs):
            if event == COMPILE_EVENT:
                events.append(event)

        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            yield events
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)

    return counting


# The files whose items take a worker 15 seconds or more (notebooks run in
# kernels, docs pages, libraries run in a child process), run first: with
# `pytest -n 2 --dist worksteal` the other worker's short items then fill in
# around them, where one of them started last would leave a worker idle.
LONG_FIRST = (
    "notebooks/training.ipynb",
    "notebooks/pretrained_models.ipynb",
    "tests/docs/test_docs_code.py",
    "tests/ecosystem/test_ecosystem.py",
    "tests/ecosystem/test_ecosystem_libraries.py",
)


def pytest_collection_modifyitems(config, items):
    """The items of `LONG_FIRST`'s files first, in their own order, then the rest
    as collected (every test passes in any order)."""
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    first = [item for item in items if item.nodeid.split("::")[0] in rank]
    first.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable
    rest = [item for item in items if item.nodeid.split("::")[0] not in rank]
    items[:] = first + rest


# JAX keeps every program it compiles, with the MLIR context it was lowered in,
# until `jax.clear_caches()`, and a worker compiles about 3,800 programs in a run.
# Making a context takes longer the more are alive (about 0.5 ms with none, 3.3 ms
# with 3,000: the suite's contexts took 9-10 ms each on average), and the caches'
# memory makes each compile and each full garbage collection slower too. So a
# worker empties JAX's caches between two test files once it has compiled
# `COMPILES_BEFORE_CLEARING` programs since it last did: about 4% less CPU for
# `tests/nn tests/init tests/internal` and for `tests/models tests/ecosystem`,
# for about 7% more compiles (programs an earlier file had compiled). Within a
# file nothing changes; across files, xdist's scheduling already made what was
# compiled before a test a matter of chance.
COMPILES_BEFORE_CLEARING = 500
_compiles_since_clearing = [0]


def _count_compiles(event, duration, **kwargs):
    if event == COMPILE_EVENT:
        _compiles_since_clearing[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


@pytest.hookimpl(trylast=True)  # after the file's fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    """Between two files, `jax.clear_caches()` once enough has been compiled."""
    if nextitem is not None and nextitem.path == item.path:
        return
    if _compiles_since_clearing[0] >= COMPILES_BEFORE_CLEARING:
        _compiles_since_clearing[0] = 0
        jax.clear_caches()


def pytest_collection_finish(session):
    """Once everything the tests import is loaded: move those objects (modules,
    classes, functions; none of them garbage) out of the collector's reach, so
    that each full collection during the run, automatic or a test's own
    `gc.collect()`, walks only what the tests themselves made."""
    gc.collect()
    gc.freeze()


# Not a doctest module: notebooks/conftest.py is a "conftest" too, and whichever
# pytest imports last owns that module name, so importing this file again for
# `--doctest-modules` would find the other one.
collect_ignore = ["conftest.py"]
