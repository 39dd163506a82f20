"""Importing boxwood creates no array and touches no device (so JAX can still be
configured afterwards: device counts, platforms, `jax.distributed`)."""

import os
import subprocess
import sys

_PROBE = """
import jax
import boxwood, boxwood.nn
from jax._src import xla_bridge
assert not xla_bridge.backends_are_initialized(), "a JAX backend was started"
jax.config.update("jax_num_cpu_devices", 4)
assert len(jax.devices("cpu")) == 4
print("ok")
"""


def test_import_starts_no_backend():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
