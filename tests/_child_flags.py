"""The environment of a child Python process that a test starts: `child_env`, the
`XLA_FLAGS` for it, and a port on 127.0.0.1 for processes that talk to each other
(`localhost_port`)."""

import contextlib
import errno
import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

# as pyproject.toml's filterwarnings for the suite itself
QUIET_TPU_RUNTIME = (
    "ignore:Transparent hugepages are not enabled:UserWarning,"
    "ignore::UserWarning:jax._src.cloud_tpu_init"
)


def child_env(**overrides: str | None) -> dict[str, str]:
    """This process's environment for a child process, with `JAX_PLATFORMS=cpu` and
    `overrides` (a value of `None` removes that variable).

    The child runs on the CPU whatever this process's backend: an accelerator this
    process has opened is held by it (a TPU chip opens in one process at a time),
    so a child reaching for it would fail. Every test child gets its environment
    here (tests/house/test_child_processes.py checks it); one that needs this process's
    backend would set `JAX_PLATFORMS` itself and say why."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    # the TPU runtime's start-up advice at `import jax` (on a TPU machine, even
    # with JAX_PLATFORMS=cpu) is not the child's output that a test reads
    warnings = [env.get("PYTHONWARNINGS"), QUIET_TPU_RUNTIME]
    env["PYTHONWARNINGS"] = ",".join(filter(None, warnings))
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def localhost_port() -> int:
    """A free TCP port on 127.0.0.1 for a multi-process JAX job of a test.

    Skips the test where this machine allows no TCP sockets at all (a sandbox
    without a network stack answers `EAFNOSUPPORT`): the processes could not
    reach each other there."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError as error:
        if error.errno not in (errno.EAFNOSUPPORT, errno.EPERM, errno.EACCES):
            raise
        pytest.skip(f"this machine opens no TCP socket on 127.0.0.1 ({error})")


def xla_flags_with_devices(n: int | None) -> str:
    """This process's `XLA_FLAGS` (the compile settings of tests/conftest.py among
    them) with `n` simulated CPU devices in place of any device count, or with no
    device count when `n` is None (a child that sets `jax_num_cpu_devices`
    itself). A child given a bare `XLA_FLAGS` of its own would compile at XLA's
    default settings, several times slower for the suite's tiny programs."""
    count = "--xla_force_host_platform_device_count"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if count not in f]
    return " ".join([*flags, *([] if n is None else [f"{count}={n}"])])


def xla_flags_for_running() -> str:
    """This process's `XLA_FLAGS` at XLA's backend optimisation level 1 in place of
    the lowest level of tests/conftest.py: for a child whose time goes to running
    its programs (a training run of hundreds of steps) rather than to compiling
    them. The training notebook took about 18% less CPU time at level 1 than at
    XLA's default level (2), and less than half that of the lowest level."""
    level = "--xla_backend_optimization_level"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if level not in f]
    return " ".join([*flags, f"{level}=1"])


def xla_accepts(flags: list[str]) -> bool:
    """Whether this jaxlib's XLA accepts every one of `flags` (an unknown flag in
    `XLA_FLAGS` aborts every process that starts JAX): a child process starts JAX
    with them and nothing else in `XLA_FLAGS`."""
    probe = "import jax; jax.numpy.zeros(1).block_until_ready()"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=child_env(XLA_FLAGS=" ".join(flags)),
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def quick_cpu_compiles() -> None:
    """XLA's CPU code generation at its lowest optimisation level, with its
    older fusion code generators in place of the MLIR fusion emitters, and in one
    piece: the suite's programs are tiny, and most of its time went to compiling
    them (a one-layer model's training step compiles about three times faster at
    the lowest level; the older emitters take about 30% off what is left; and
    generating a module's code in one piece instead of split for several threads
    took about 20% off the rest: a two-layer GPT-2 training step, on one core,
    1.25-1.33 s against 0.98-1.03 s, and `pytest -n 2 tests/models` 165.9 s
    against 147.9 s, the workers on a core each). Results are the same
    programs' results, up to rounding; set only where no accelerator plugin is
    installed and `XLA_FLAGS` does not already choose (subprocesses, xdist's
    workers among them, inherit it). tests/conftest.py calls it at start, and
    notebooks/conftest.py for a run of the notebooks alone."""
    if any(importlib.util.find_spec(m) for m in ("libtpu", "jax_plugins")):
        return
    flags = os.environ.get("XLA_FLAGS", "").split()
    wanted = [
        f"{name}={value}"
        for name, value in (
            ("--xla_backend_optimization_level", "0"),
            ("--xla_cpu_use_fusion_emitters", "false"),
            ("--xla_cpu_parallel_codegen_split_count", "1"),
        )
        if not any(f.startswith(name) for f in flags)
    ]
    if wanted and not xla_accepts(wanted):  # one probe, or one per flag
        wanted = [flag for flag in wanted if xla_accepts([flag])]
    os.environ["XLA_FLAGS"] = " ".join(flags + wanted)


def share_cores_among_workers() -> None:
    """In a pytest-xdist worker: this process, and every child it starts, on its
    own share of the machine's cores (worker k of n takes every n-th core from
    the k-th; with more workers than cores, they take the cores in turn). XLA's CPU client
    sizes its thread pool by the cores a process may run on, and a worker's
    programs are tiny: with two workers on two cores, each worker's pool of two
    threads split each program across the core the other worker was busy on,
    and the threads waited on each other (the training notebook's step took
    about 11% more time, `pytest -n 2 tests/models` 4-6% more in two
    alternating rounds). Outside xdist, or where
    the platform cannot set affinities, nothing changes."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit()):
        return
    if not hasattr(os, "sched_setaffinity"):
        return
    os.sched_setaffinity(0, core_share(int(worker[2:]), int(count)))


def core_share(worker: int, workers: int, cores: set[int] | None = None) -> set[int]:
    """The cores (of `cores`, default this process's) of xdist worker `worker`
    of `workers`: every `workers`-th from the `worker`-th, taken in turn where
    there are more workers than cores; never empty."""
    ordered = sorted(os.sched_getaffinity(0) if cores is None else cores)
    first = worker % len(ordered)  # < workers, so the share holds that core at least
    return {core for i, core in enumerate(ordered) if i % workers == first}


@contextlib.contextmanager
def one_core() -> Iterator[None]:
    """This thread on one of its cores for the duration, so that a process it
    starts meanwhile runs on that core alone (XLA's CPU client then has one
    thread, whose results do not depend on how many cores the machine has: a
    notebook's committed outputs come out the same on any machine). Where the
    platform cannot set affinities, nothing changes."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)
