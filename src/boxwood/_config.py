"""`boxwood.config`: global switches."""

from __future__ import annotations

import os


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Config:
    """Global settings. Change them by assignment: `boxwood.config.explain_recompiles = True`.

    - `explain_recompiles`: every retrace of a `filter_jit` function after its first
      trace emits a [`boxwood.RecompileWarning`][] naming what changed, as paths in
      the caller's own names. Also set by the environment variable
      `BOXWOOD_EXPLAIN_RECOMPILES=1`; per function with `filter_jit(..., explain=True)`.
    """

    __slots__ = ("explain_recompiles",)

    def __init__(self) -> None:
        self.explain_recompiles = env_flag("BOXWOOD_EXPLAIN_RECOMPILES")

    def __repr__(self) -> str:
        return f"Config(explain_recompiles={self.explain_recompiles})"


config = Config()
