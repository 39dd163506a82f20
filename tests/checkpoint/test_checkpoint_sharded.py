"""Sharded load on 8 simulated CPU devices (in a subprocess: the device count is
fixed when JAX starts): each array is placed with `like`'s sharding, and each
device's shard is read from the file on its own."""

import os
import subprocess
import sys
import textwrap

from _child_flags import child_env, xla_flags_with_devices

SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import boxwood, boxwood.nn as nn
from boxwood._checkpoint import _safetensors

assert jax.device_count() == 8
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
model = nn.MLP(16, 8, 32, 1, key=jax.random.key(0))
path = PATH
boxwood.save(path, model)

def target(leaf):
    spec = P("data", "model") if leaf.ndim == 2 else P("data")
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

like = jax.tree.map(target, boxwood.filter_eval_shape(lambda: model))
reads = []
original = _safetensors.FileTensor.read
def spy(self, index=None):
    out = original(self, index)
    reads.append((self.info.shape, out.shape))
    return out
_safetensors.FileTensor.read = spy
loaded = boxwood.load(path, like)
_safetensors.FileTensor.read = original

w = loaded.layers[0].weight
assert w.sharding == like.layers[0].weight.sharding, w.sharding
assert {s.data.shape for s in w.addressable_shards} == {(8, 8)}
assert len(w.addressable_shards) == 8
for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(model)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
# every read was one device's shard, never a whole array
assert reads and all(np.prod(got) * 4 <= np.prod(full) for full, got in reads), reads

# a real sharded tree as `like`, and a typed key replicated over the mesh
replicated = NamedSharding(mesh, P())
like2 = (jax.device_put(jnp.zeros((32, 16)), NamedSharding(mesh, P(None, "model"))), jax.device_put(jax.random.key(1), replicated))
boxwood.save(path, (model.layers[0].weight, jax.random.key(5)))
w2, k2 = boxwood.load(path, like2)
assert w2.sharding == like2[0].sharding and k2.sharding == replicated
np.testing.assert_array_equal(np.asarray(w2), np.asarray(model.layers[0].weight))
assert jax.random.key_data(k2).tolist() == jax.random.key_data(jax.random.key(5)).tolist()

# a sharded tree saves to one file (gathered on the host) like an unsharded one
boxwood.save(path, loaded)
again = boxwood.load(path, model)
assert boxwood.tree_equal(again, model)
print("SHARDED-OK")
"""


def test_sharded_load_on_eight_devices(tmp_path):
    env = child_env(
        XLA_FLAGS=xla_flags_with_devices(8), PYTHONPATH=os.pathsep.join(sys.path)
    )
    code = SCRIPT.replace("PATH", repr(str(tmp_path / "model.safetensors")))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SHARDED-OK" in result.stdout
