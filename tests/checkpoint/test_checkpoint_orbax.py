"""Checkpoints through orbax-checkpoint: `format="orbax"` in one process, boxwood
modules with orbax's own checkpointer, and a tree sharded over two real processes
on localhost (saved, then restored into a different sharding; a Checkpointer
that keeps the newest steps and resumes)."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _child_flags import child_env, localhost_port, xla_flags_with_devices

ocp = pytest.importorskip("orbax.checkpoint")


def test_orbax_format_round_trip_and_validation(tmp_path, getkey):
    model = nn.MLP(3, 2, 4, 1, key=getkey())
    tree = (model, jax.random.key(3), np.arange(3, dtype=np.int32))
    boxwood.save(tmp_path / "ckpt", tree, format="orbax", metadata={"step": 4})
    assert boxwood.read_metadata(tmp_path / "ckpt") == {"step": 4}
    out = boxwood.load(tmp_path / "ckpt", boxwood.filter_eval_shape(lambda: tree))
    assert boxwood.tree_equal(out[0], model)
    assert jax.random.key_data(out[1]).tolist() == jax.random.key_data(tree[1]).tolist()
    wrong = (nn.MLP(3, 2, 5, 1, key=getkey()), jax.random.key(0), np.zeros(3, np.int32))
    with pytest.raises(boxwood.CheckpointError) as info:
        boxwood.load(tmp_path / "ckpt", wrong)
    assert info.value.problems == [
        "0.layers.0.weight: file has f32[4,3], model expects f32[5,3]",
        "0.layers.0.bias: file has f32[4], model expects f32[5]",
        "0.layers.1.weight: file has f32[2,4], model expects f32[2,5]",
    ]
    handle = boxwood.save(tmp_path / "later", tree, format="orbax", blocking=False)
    handle.wait()
    assert boxwood.tree_equal(boxwood.load(tmp_path / "later", tree)[0], model)


def test_checkpointer_keep_does_not_count_an_empty_step_directory(tmp_path):
    ckpt = boxwood.Checkpointer(tmp_path, keep=2, format="orbax")
    for step in (1, 2):
        ckpt.save(step, {"w": jnp.full(3, float(step))})
    os.makedirs(tmp_path / "step_000003")  # damaged: its contents are gone
    ckpt.save(4, {"w": jnp.full(3, 4.0)})
    assert ckpt.all_steps() == [2, 3, 4]  # two complete ones: 2 and 4
    ckpt.save(5, {"w": jnp.full(3, 5.0)})
    assert ckpt.all_steps() == [4, 5]
    assert ckpt.restore({"w": jnp.zeros(3)})["w"].tolist() == [5.0] * 3


def test_not_an_orbax_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        boxwood.CheckpointError, match="empty: not a boxwood orbax checkpoint"
    ):
        boxwood.load(tmp_path / "empty", {"w": jnp.zeros(2)})


def test_boxwood_modules_with_orbax_own_checkpointer(tmp_path, getkey):
    model = nn.MLP(3, 2, 4, 1, key=getkey())
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "plain", model)
    checkpointer.wait_until_finished()
    abstract = boxwood.filter_eval_shape(nn.MLP, 3, 2, 4, 1, key=getkey())
    restored = checkpointer.restore(tmp_path / "plain", abstract)
    assert isinstance(restored, nn.MLP) and boxwood.tree_equal(restored, model)


# Both scenarios run one after the other in the same pair of processes (one
# Python start, JAX and orbax import and `jax.distributed` set-up for the two);
# each prints its own `SCENARIO-<name>-<pid>-OK` or its traceback, and the next
# one still runs.
TWO_PROCESSES = r"""
import os, sys, traceback, warnings
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

port, pid = sys.argv[1], int(sys.argv[2])
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
    initialization_timeout=120,
)
import boxwood

assert jax.process_count() == 2 and jax.device_count() == 8, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, P("x", None))
columns = NamedSharding(mesh, P(None, "x"))


def sharded(directory):
    full = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    w = jax.make_array_from_callback(full.shape, rows, lambda index: full[index])
    assert not w.is_fully_addressable
    tree = {"encoder": {"weight": w}, "step": np.int32(7)}
    try:  # one .safetensors file cannot hold an array no process holds whole
        boxwood.save(directory + ".safetensors", tree, format="safetensors")
    except boxwood.CheckpointError as e:
        assert "Cannot save `encoder.weight` to one file: it spans several processes" in str(e), e
    else:
        raise AssertionError("no error")
    boxwood.save(directory, tree, metadata={"step": 7})  # spans two processes: orbax

    like = {"encoder": {"weight": jax.ShapeDtypeStruct((64, 8), jnp.float32, sharding=columns)}, "step": np.int32(0)}
    out = boxwood.load(directory, like)
    got = out["encoder"]["weight"]
    assert got.sharding == columns, got.sharding
    assert {s.data.shape for s in got.addressable_shards} == {(64, 1)}
    for shard in got.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index])
    assert out["step"] == 7
    assert boxwood.read_metadata(directory) == {"step": 7}
    bad = {"encoder": {"weight": jax.ShapeDtypeStruct((64, 4), jnp.float32, sharding=columns)}}
    try:
        boxwood.load(directory, bad)
    except boxwood.CheckpointError as e:
        assert e.problems == ["step: in the file but not in the model", "encoder.weight: file has f32[64,8], model expects f32[64,4]"], e.problems
    else:
        raise AssertionError("no error")


def checkpointer(directory):
    def full(step):
        return np.arange(64 * 8, dtype=np.float32).reshape(64, 8) + 1000 * step

    def tree(step):
        w = jax.make_array_from_callback((64, 8), rows, lambda index: full(step)[index])
        return {"w": w, "step": np.int32(step)}

    ckpt = boxwood.Checkpointer(directory, keep=2)
    assert ckpt.latest_step() is None
    if pid == 0:  # what a killed save left: removed by the next save
        os.makedirs(os.path.join(directory, ".step_000005.saving", "state"))
    multihost_utils.sync_global_devices("leftover made")
    for step in (10, 20, 30):
        handle = ckpt.save(step, tree(step), metadata={"loss": step / 10}, blocking=step != 20)
        if handle is not None:
            handle.wait()
    ckpt.wait()
    assert sorted(os.listdir(directory)) == ["step_000020", "step_000030"], os.listdir(directory)
    assert ckpt.all_steps() == [20, 30] and ckpt.latest_step() == 30
    assert ckpt.read_metadata() == {"loss": 3.0, "step": 30}

    like = {"w": jax.ShapeDtypeStruct((64, 8), jnp.float32, sharding=columns), "step": np.int32(0)}
    for step in (None, 20):
        out = ckpt.restore(like, step=step)
        want = step or 30
        assert out["step"] == want and out["w"].sharding == columns
        for shard in out["w"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), full(want)[shard.index])

    # a damaged newest step (a directory that is not a complete checkpoint) is skipped
    if pid == 0:
        os.makedirs(os.path.join(directory, "step_000040"))
    multihost_utils.sync_global_devices("damaged made")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ckpt.latest_step() == 30
    assert any("Skipping a damaged checkpoint" in str(w.message) for w in caught), caught
    assert ckpt.restore(like)["step"] == 30


for name, directory in zip(sys.argv[3::2], sys.argv[4::2]):
    try:
        globals()[name](directory)
    except Exception:
        print(f"SCENARIO-{name}-{pid}-FAILED\n{traceback.format_exc()}", flush=True)
    else:
        print(f"SCENARIO-{name}-{pid}-OK", flush=True)
    multihost_utils.sync_global_devices(name + " done")  # reached after a failure too
jax.distributed.shutdown()
"""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> list[tuple[int, str]]:
    """The exit statuses and outputs of processes 0 and 1 of a 2-process JAX job on localhost (4 CPU
    devices each) that ran the scenarios of `TWO_PROCESSES`, each in a directory
    of its own; both processes are always reaped, even after a timeout or a
    failure."""
    directory = tmp_path_factory.mktemp("two_processes")
    scenarios = []
    for name, where in (("sharded", "sharded"), ("checkpointer", "run")):
        scenarios += [name, str(directory / where)]
    port = localhost_port()
    env = child_env(
        XLA_FLAGS=xla_flags_with_devices(4), PYTHONPATH=os.pathsep.join(sys.path)
    )
    script = textwrap.dedent(TWO_PROCESSES)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(port), str(i), *scenarios],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def _assert_scenario_ran(two_processes: list, name: str) -> None:
    for i, (returncode, out) in enumerate(two_processes):
        assert returncode == 0, out[-4000:]
        assert f"SCENARIO-{name}-{i}-OK" in out, out[-4000:]


def test_two_processes_save_sharded_and_restore_resharded(two_processes):
    _assert_scenario_ran(two_processes, "sharded")


def test_two_processes_checkpointer_keeps_newest_and_resumes(two_processes):
    _assert_scenario_ran(two_processes, "checkpointer")


def test_checkpointer_orbax_steps_in_one_process(tmp_path):
    ckpt = boxwood.Checkpointer(tmp_path / "run", keep=2, format="orbax")
    assert repr(ckpt).endswith("keep=2, format='orbax')")
    (tmp_path / "run" / "step_000001.safetensors").write_bytes(b"old form")
    for step in (1, 2, 3):
        ckpt.save(step, {"w": jnp.full(3, float(step))}, blocking=step == 2)
    ckpt.wait()
    assert sorted(os.listdir(tmp_path / "run")) == ["step_000002", "step_000003"]
    assert ckpt.path(3) == tmp_path / "run" / "step_000003"
    assert ckpt.restore({"w": jnp.zeros(3)})["w"].tolist() == [3, 3, 3]
    assert ckpt.read_metadata(2) == {"step": 2}
    # a step saved again as a file replaces its directory
    boxwood.Checkpointer(tmp_path / "run", format="safetensors").save(
        3, {"w": jnp.ones(3)}
    )
    assert sorted(os.listdir(tmp_path / "run")) == [
        "step_000002",
        "step_000003.safetensors",
    ]
    with pytest.raises(ValueError, match="`format` must be"):
        boxwood.Checkpointer(tmp_path, format="npz")


def test_checkpointer_skips_a_damaged_step_directory(tmp_path):
    ckpt = boxwood.Checkpointer(tmp_path, format="orbax")
    ckpt.save(1, {"w": jnp.ones(2)})
    (tmp_path / "step_000002").mkdir()
    with pytest.warns(UserWarning, match="step_000002: not a boxwood orbax checkpoint"):
        assert ckpt.latest_step() == 1


# Imports JAX, boxwood and orbax once (no threads start, no backend), then forks
# one saver per line read from stdin and reaps it once the test has killed it.
# JAX's backend starts only in each saver (forking a process whose backend runs
# is unsafe), so every saver is a fresh process saving with orbax until killed.
KILLED_SAVERS = r"""
import os, sys
import jax.numpy as jnp
import orbax.checkpoint  # for every saver at once
import boxwood

forker = os.getpid()
for _ in sys.stdin:
    pid = os.fork()
    if pid == 0:  # the saver
        ckpt = boxwood.Checkpointer(sys.argv[1], keep=2, format="orbax")
        step = (ckpt.latest_step() or 0) + 1
        print("READY", os.getpid(), flush=True)
        while os.getppid() == forker:  # until killed (or orphaned by a failed test)
            ckpt.save(step, {"w": jnp.full(200_000, float(step)), "b": jnp.full(3, float(step))})
            step += 1
    os.waitpid(pid, 0)
    print("REAPED", flush=True)
"""


def test_sigkill_during_checkpointer_orbax_save(tmp_path):
    """Killed at several points of its saves, a process leaves the newest step
    directory complete, and the next save removes what it left behind."""
    directory = tmp_path / "run"
    ckpt = boxwood.Checkpointer(directory, keep=2, format="orbax")
    like = {"w": jnp.zeros(200_000), "b": jnp.zeros(3)}
    ckpt.save(0, like)
    env = child_env(PYTHONPATH=os.pathsep.join(sys.path))
    forker = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVERS, str(directory)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    left = 0
    saver = None
    try:
        for delay in (0.1, 0.4, 0.7, 1.3):
            forker.stdin.write("fork\n")
            forker.stdin.flush()
            ready = forker.stdout.readline()
            assert ready.startswith("READY "), ready  # the saver started
            saver = ready.split()[1]
            time.sleep(delay)
            os.kill(int(saver), signal.SIGKILL)  # mid-save or between saves
            assert forker.stdout.readline().strip() == "REAPED"
            saver = None
            left += any(name.startswith(".") for name in os.listdir(directory))
            step = ckpt.latest_step()
            out = ckpt.restore(like)  # the newest step directory is complete
            assert out["w"].min() == out["w"].max() == out["b"][0] == step
    finally:
        if saver is not None:  # a failure before its kill
            with contextlib.suppress(ProcessLookupError):  # unless it died itself
                os.kill(int(saver), signal.SIGKILL)
        forker.kill()
        forker.communicate()
    # The next save removes what the killed saves left. It saves step + 2, not the
    # step + 1 the last saver was writing, whose staging directory it would
    # reuse: a leftover of step + 1 (made here if that kill left none) must go.
    os.makedirs(directory / f".step_{step + 1:06d}.saving" / "state", exist_ok=True)
    ckpt.save(step + 2, like)
    assert sorted(os.listdir(directory)) == [
        f"step_{step:06d}",
        f"step_{step + 2:06d}",
    ]
    assert left > 0  # at least one kill came in the middle of a save
