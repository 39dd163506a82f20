"""Every child Python process a test starts runs on the CPU (`child_env`), so that
the suite runs on a machine whose accelerator the pytest process holds; each xdist
worker, with its children, on its own share of the cores (`core_share`)."""

import ast
import errno
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from _child_flags import (
    child_env,
    core_share,
    localhost_port,
    xla_accepts,
    xla_flags_with_devices,
)

TESTS = pathlib.Path(__file__).resolve().parents[1]

# Children that never start JAX, with what they run.
NO_JAX = {
    "test_packaging.py": "python -m build",
    "test_typing.py": "basedpyright",
}


STARTS = ("sys.executable", "NotebookClient")


def _starts(call: ast.Call) -> bool:
    name = ast.unparse(call.func)
    return name.endswith(("subprocess.run", "subprocess.Popen", ".execute"))


def test_every_child_gets_its_environment_from_child_env():
    unpinned = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        if path.name in NO_JAX or not any(s in text for s in STARTS):
            continue
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, ast.FunctionDef):
                continue
            source = ast.unparse(function)
            if not any(s in source for s in STARTS):
                continue
            calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
            for call in filter(_starts, calls):
                if not any(k.arg == "env" for k in call.keywords):
                    unpinned.append(f"{path.name}:{call.lineno} passes no env")
            if "child_env(" not in text:
                unpinned.append(f"{path.name}:{function.lineno} uses no child_env")
    assert unpinned == []


def test_child_env_pins_the_cpu_and_removes_what_is_none(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.setenv("XLA_FLAGS", "--x")
    env = child_env(XLA_FLAGS=None, EXTRA="1")
    assert env["JAX_PLATFORMS"] == "cpu" and env["EXTRA"] == "1"
    assert "XLA_FLAGS" not in env


def test_a_child_does_not_print_the_tpu_runtimes_start_up_advice(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    code = (
        "import warnings; warnings.warn('Transparent hugepages are not enabled. "
        "TPU runtime startup ...'); warnings.warn('other', DeprecationWarning)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env()
    )
    assert "hugepages" not in done.stderr
    assert "DeprecationWarning: other" in done.stderr  # the caller's own filters stay


def test_localhost_port_skips_where_no_socket_opens(monkeypatch):
    assert 0 < localhost_port() < 2**16

    def refused(errno_):
        def make(*args, **kwargs):
            raise OSError(errno_, os.strerror(errno_))

        return make

    monkeypatch.setattr(socket, "socket", refused(errno.EAFNOSUPPORT))
    with pytest.raises(pytest.skip.Exception, match="opens no TCP socket on 127.0.0.1"):
        localhost_port()
    monkeypatch.setattr(socket, "socket", refused(errno.EMFILE))
    with pytest.raises(OSError, match="Too many open files"):
        localhost_port()  # any other failure is the test's failure


def test_an_unknown_xla_flag_is_refused_before_it_is_set():
    """tests/conftest.py sets its compile flags only where `xla_accepts` says this
    jaxlib knows them: an unknown one would abort every JAX process."""
    assert xla_accepts(["--xla_backend_optimization_level=0"])  # the probe runs
    assert not xla_accepts(["--xla_cpu_no_such_flag_in_any_jaxlib=true"])


def test_xla_flags_with_devices_keeps_the_rest(monkeypatch):
    count = "--xla_force_host_platform_device_count"
    monkeypatch.setenv("XLA_FLAGS", f"--a=1 {count}=3 --b=2")
    assert xla_flags_with_devices(8) == f"--a=1 --b=2 {count}=8"
    assert xla_flags_with_devices(None) == "--a=1 --b=2"


def test_workers_share_the_cores_in_turn():
    assert [core_share(k, 2, {0, 1}) for k in range(2)] == [{0}, {1}]
    assert [core_share(k, 3, {0, 1}) for k in range(3)] == [{0}, {1}, {0}]
    assert core_share(1, 2, set(range(6))) == {1, 3, 5}
    assert core_share(0, 1, {4, 7}) == {4, 7}  # one worker keeps them all


@pytest.mark.skipif(
    "PYTEST_XDIST_WORKER" not in os.environ or not hasattr(os, "sched_getaffinity"),
    reason="only an xdist worker on a platform with CPU affinities is pinned",
)
def test_this_worker_runs_on_its_share_of_the_cores():
    worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    before = os.sched_getaffinity(os.getppid())  # the xdist controller's, unpinned
    assert os.sched_getaffinity(0) == core_share(worker, workers, before)
