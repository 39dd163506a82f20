"""The suite's cross-backend comparisons (tests/_precision.py) are as strict as they
say: exact on the CPU, and loose off it only where they say."""

import ml_dtypes
import numpy as np
import pytest

import _precision
from _precision import assert_same_draws, tolerance


def test_an_accelerator_tolerance_is_never_the_stricter():
    with pytest.raises(
        ValueError, match="accelerator=1e-06 is stricter than cpu=1e-05"
    ):
        tolerance(cpu=1e-5, accelerator=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_draws_are_bit_identical_except_a_half_truncated_normal_off_the_cpu(
    dtype, monkeypatch
):
    theirs = np.array([-1.5, -0.25, 0.0, 0.75, 1.25], dtype)
    bits = theirs.view(np.uint16)
    two_up = (bits + 2).view(dtype)  # 2 ulps away from zero, whatever the sign
    three_up = (bits + 3).view(dtype)
    across_zero = np.array([-0.0], dtype)  # 0 ulps from +0.0
    monkeypatch.setattr(_precision, "on_cpu", lambda: True)
    with pytest.raises(AssertionError):
        assert_same_draws(two_up, theirs, "truncated_normal")
    monkeypatch.setattr(_precision, "on_cpu", lambda: False)
    assert_same_draws(two_up, theirs, "truncated_normal")
    assert_same_draws(across_zero, np.array([0.0], dtype), "truncated_normal")
    with pytest.raises(AssertionError, match="3 ulps apart"):
        assert_same_draws(three_up, theirs, "truncated_normal")
    with pytest.raises(AssertionError):
        assert_same_draws(two_up, theirs, "normal")  # other draws: bit for bit
    with pytest.raises(AssertionError):
        assert_same_draws(theirs.astype(np.float32), theirs, "truncated_normal")
