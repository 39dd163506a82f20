"""`CheckpointError`: the one error a checkpoint load or save raises for bad input."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint file or the tree given with it is not usable.

    Raised for a missing, truncated, corrupted or non-safetensors file (the message
    names the file and what is wrong), and by a validated load, which lists every
    problem at once: missing keys, unexpected keys, shape and dtype mismatches.
    `problems` holds those lines, one per problem.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


CheckpointError.__module__ = "boxwood"  # tracebacks show the public name
