"""Importing boxwood creates no array and touches no device (so JAX can still be
configured afterwards: device counts, platforms, `jax.distributed`), and leaves
Pallas's TPU kernels unimported until splash attention is used. In the same
fresh process: comparing two known enumeration items compiles nothing."""

import subprocess
import sys

from _child_flags import child_env

_PROBE = """
import sys
import jax, jax.monitoring
import boxwood, boxwood.nn
assert "jax.experimental.pallas.ops.tpu.splash_attention" not in sys.modules
from jax._src import xla_bridge
assert not xla_bridge.backends_are_initialized(), "a JAX backend was started"
jax.config.update("jax_num_cpu_devices", 4)
assert len(jax.devices("cpu")) == 4
compiled = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: compiled.append(name) if "backend_compile" in name else None
)
class R(boxwood.Enumeration):
    a = ""
    b = "b"
same, other = R.a == R.a, R.a != R.b
assert isinstance(same, jax.Array) and bool(same) and bool(other)
assert not compiled, compiled
print("ok")
"""


def test_import_starts_no_backend():
    env = child_env(XLA_FLAGS=None)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
