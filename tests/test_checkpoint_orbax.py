"""Checkpoints through orbax-checkpoint: `format="orbax"` in one process, boxwood
modules with orbax's own checkpointer, and a tree sharded over two real processes
on localhost (saved, then restored into a different sharding)."""

import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn

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


WORKER = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

port, pid, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
    initialization_timeout=120,
)
import boxwood

assert jax.process_count() == 2 and jax.device_count() == 8, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("x",))
full = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
rows = NamedSharding(mesh, P("x", None))
w = jax.make_array_from_callback(full.shape, rows, lambda index: full[index])
assert not w.is_fully_addressable
tree = {"encoder": {"weight": w}, "step": np.int32(7)}
boxwood.save(directory, tree, metadata={"step": 7})  # spans two processes: orbax

columns = NamedSharding(mesh, P(None, "x"))
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
print(f"PROCESS-{pid}-OK", flush=True)
jax.distributed.shutdown()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_save_sharded_and_restore_resharded(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    directory = str(tmp_path / "sharded")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(WORKER),
                str(port),
                str(i),
                directory,
            ],
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
        for proc in procs:  # always reaped, even after a timeout or a failure
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    for i, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, out[-4000:]
        assert f"PROCESS-{i}-OK" in out
