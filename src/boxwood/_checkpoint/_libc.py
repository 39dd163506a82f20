"""Functions of the C library through `ctypes`, which releases the GIL during a
call (the `os` and `mmap` wrappers of some of them keep it, or are missing)."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from typing import Any


@functools.cache
def linux_function(name: str, argtypes: tuple, restype: Any) -> Callable | None:
    """libc's `name` with its argument and result types set, or `None` off Linux
    or where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = restype
    return function
