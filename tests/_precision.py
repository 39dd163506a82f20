"""Float32 exactness across backends.

JAX's default matmul precision depends on the backend: full float32 on the CPU,
but a GPU's default may round the operands of a matrix product to TF32 or bfloat16
(about 1e-3 relative error). Tests whose point is that two float32 computations
agree to a CPU-sized tolerance run under `highest` precision on every backend:

    from _precision import highest_matmul_precision  # noqa: F401
    pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

On the CPU this changes nothing (its default already is full precision).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest


@pytest.fixture
def highest_matmul_precision():
    """Runs the test with `jax.default_matmul_precision("highest")`."""
    with jax.default_matmul_precision("highest"):
        yield


def on_cpu() -> bool:
    """Whether JAX's default backend is the CPU (where the suite's float32
    tolerances were measured)."""
    return jax.default_backend() == "cpu"


def reduction_atol(magnitude: float, spread: float, ulps: int = 32) -> float:
    """An absolute tolerance for a float32 value standardised by a mean over data
    of size `magnitude` and spread `spread`: a backend may order the sum
    differently (a GPU reduces as a tree), which moves the mean by a few ulps of
    `magnitude`, and standardising divides that by `spread`."""
    return ulps * float(np.finfo(np.float32).eps) * magnitude / spread


def tolerance(*, cpu: float, accelerator: float) -> float:
    """A float32 tolerance chosen by JAX's default backend: `cpu` where the suite's
    figures were measured, `accelerator` on a TPU or GPU.

    Even at `highest` matmul precision a TPU's float32 differs from the CPU's in
    more than the last bit: its matrix products sum bfloat16 pieces (six passes),
    its `exp`, `tanh` and `logistic` are approximations good to a few ulps, and
    its reductions group terms differently. A test states both figures, so that
    the CPU assertion stays exactly as strict as it was; the accelerator's may
    only be looser."""
    if accelerator < cpu:
        raise ValueError(f"accelerator={accelerator} is stricter than cpu={cpu}")
    return cpu if on_cpu() else accelerator


def assert_same_draws(ours, theirs, dist: str) -> None:
    """`ours` and `theirs` (`jax.random`'s) are the same draw of distribution
    `dist`: bit for bit, except a float16 or bfloat16 truncated normal off the
    CPU, which may be up to 2 ulps away.

    That distribution's half-precision arithmetic (`erf_inv`, scaling, clipping)
    runs in two programs that XLA fuses differently, and a TPU rounds some draws
    differently: on a v5e, one or two ulps for some keys. The random bits are the
    same."""
    a, b = np.asarray(ours), np.asarray(theirs)
    assert (a.dtype, a.shape) == (b.dtype, b.shape)
    if on_cpu() or dist != "truncated_normal" or a.dtype.itemsize != 2:
        assert a.tobytes() == b.tobytes()
        return

    def ordered(x):  # sign and magnitude as one ordered integer
        bits = x.view(np.uint16).astype(np.int32)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)

    apart = np.abs(ordered(a) - ordered(b))
    assert apart.max(initial=0) <= 2, f"{apart.max()} ulps apart"
