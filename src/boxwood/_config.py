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
    - `recompile_notes` (default `True`): under IPython (a Jupyter notebook, the
      IPython shell), the third compile of one `filter_jit` function prints a
      one-line note saying what changed (a rebound global, a new shape), since a
      function that keeps recompiling is worth knowing about while experimenting.
      Set it to `False`, or the environment variable `BOXWOOD_RECOMPILE_NOTES=0`,
      to silence it. Never printed outside IPython.
    """

    __slots__ = ("explain_recompiles", "recompile_notes")

    def __init__(self) -> None:
        self.explain_recompiles = env_flag("BOXWOOD_EXPLAIN_RECOMPILES")
        notes = os.environ.get("BOXWOOD_RECOMPILE_NOTES", "1").strip().lower()
        self.recompile_notes = notes not in ("0", "false", "no", "off")

    def __repr__(self) -> str:
        return (
            f"Config(explain_recompiles={self.explain_recompiles}, "
            f"recompile_notes={self.recompile_notes})"
        )


config = Config()
