"""`XLA_FLAGS` for a child process with simulated CPU devices."""

import os


def xla_flags_with_devices(n: int) -> str:
    """This process's `XLA_FLAGS` (the compile setting of tests/conftest.py among
    them) with `n` simulated CPU devices in place of any device count."""
    count = "--xla_force_host_platform_device_count"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if count not in f]
    return " ".join([*flags, f"{count}={n}"])


def xla_flags_at_default_level() -> str:
    """This process's `XLA_FLAGS` without the lowest-optimisation setting of
    tests/conftest.py: for a child whose time goes to running its programs (a
    training run of hundreds of steps) rather than to compiling them."""
    level = "--xla_backend_optimization_level"
    return " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if level not in f
    )
