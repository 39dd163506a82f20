"""Crash safety: a saving process killed with SIGKILL at many points of the write
leaves the target either the complete old checkpoint or the complete new one, and
the next save removes the temporary files it left.

The harness runs in a subprocess that imports boxwood once and forks a saver per
kill point (the tree is NumPy arrays, so JAX's backend is never started and
forking is safe); one harness runs the foreground and the background saves one
after the other, and reports each."""

import os
import subprocess
import sys
import textwrap

import pytest

from _child_flags import child_env

MODES = ["foreground", "background"]

HARNESS = r"""
import os, signal, sys, time, traceback, warnings
import numpy as np
import boxwood

# The forked savers only write NumPy arrays to files; JAX's threads are not used.
warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
points = int(sys.argv[1])
size = 2_500_000  # two float32 arrays of 10 MB each
def tree(v):
    return {"a": np.full(size, v, np.float32), "b": {"c": np.full(size, v, np.float32)}}
trees = [tree(v) for v in range(3)]
like = tree(-1)

def run(path, mode):
    def save(v):
        if mode == "background":
            boxwood.save(path, trees[v], metadata={"v": v}, blocking=False).wait()
        else:
            boxwood.save(path, trees[v], metadata={"v": v})

    save(0)
    start = time.perf_counter(); save(0); duration = time.perf_counter() - start
    tmp_prefix = "." + os.path.basename(path) + ".tmp-"
    left_tmp = 0
    for i in range(points):
        pid = os.fork()
        if pid == 0:  # the saver: new versions, over and over, until killed
            v = 1
            while True:
                save(v)
                v = 3 - v
        time.sleep(duration * (0.05 + 2.0 * i / points))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        got = boxwood.load(path, like)  # validates the header and every byte range
        v = boxwood.read_metadata(path)["v"]
        assert got["a"].min() == got["a"].max() == v, (i, v)
        assert got["b"]["c"].min() == got["b"]["c"].max() == v, (i, v)
        left_tmp += any(n.startswith(tmp_prefix) for n in os.listdir(os.path.dirname(path)))
    save(0)
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)], os.listdir(os.path.dirname(path))
    assert left_tmp > 0
    return f"killed mid-write {left_tmp} of {points} times; save takes {duration * 1e3:.0f} ms"

for path, mode in zip(sys.argv[2::2], sys.argv[3::2]):
    try:
        said = run(path, mode)
    except Exception:
        print(f"CRASH-FAILED {mode}\n{traceback.format_exc()}", flush=True)
    else:
        print(f"CRASH-OK {mode}: {said}", flush=True)
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> subprocess.CompletedProcess:
    """One run of `HARNESS` (one Python start and boxwood import) for every mode,
    each on a file in a folder of its own."""
    arguments = []
    for mode in MODES:
        folder = tmp_path_factory.mktemp(mode)
        arguments += [str(folder / "ckpt.safetensors"), mode]
    env = child_env(PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HARNESS), "30", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("mode", MODES)
def test_sigkill_during_save_never_corrupts_the_target(harness, mode):
    assert harness.returncode == 0, harness.stdout + harness.stderr[-3000:]
    assert f"CRASH-OK {mode}:" in harness.stdout, harness.stdout[-3000:]
