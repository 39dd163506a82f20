"""A progress bar for reading a large checkpoint, shown only to a person watching.

`tqdm` draws it when installed (an optional dependency: without it nothing is
shown), when the checkpoint holds at least `MIN_BYTES`, and when the output is a
terminal or a notebook, never in a CI log (the `CI` environment variable, which
CI services set). The bar advances by the bytes of each tensor as it is loaded:
with zero-copy loading, tensors that alias the file's mapping count as loaded at
once.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

# Smaller checkpoints load in well under a second: no bar.
MIN_BYTES = 256 * 2**20


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def watched() -> bool:
    """Whether a person is likely to see the output: a terminal or a notebook,
    and not a CI service's log."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    if _in_notebook():
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _bar(total: int, description: str) -> Any:
    try:
        from tqdm.auto import tqdm  # pyright: ignore[reportMissingModuleSource]
    except ImportError:
        return None
    return tqdm(
        total=total,
        desc=description,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        leave=False,
    )


@contextlib.contextmanager
def load_progress(
    total: int, enabled: bool, description: str = "loading"
) -> Iterator[Callable[[int], None]]:
    """A function to call with the bytes of each tensor loaded, drawing a bar of
    `total` bytes while the block runs if `enabled` and the conditions above hold;
    the bar is removed when the block ends (by an error too)."""
    bar: Any = None
    if enabled and total >= MIN_BYTES and watched():
        bar = _bar(total, description)
    if bar is None:
        yield lambda nbytes: None
        return
    try:
        yield bar.update
    finally:
        bar.close()
