"""`clear_caches`: empty boxwood's global caches."""

from __future__ import annotations

from collections.abc import Callable

# Functions that empty one cache each. Modules with a global cache add theirs here
# with `register_cache_clear` at import time (`_jit/_cache.py`: the compiled programs
# of every `filter_jit` wrapper; `_transforms/_checkpoint.py`: the traced functions
# of `filter_checkpoint` wrappers; `models/_pretrained.py`: parsed checkpoint files).
_CLEARS: list[Callable[[], None]] = []


def register_cache_clear(clear: Callable[[], None]) -> Callable[[], None]:
    """Add `clear` to what [`boxwood.clear_caches`][] runs; returns `clear`."""
    _CLEARS.append(clear)
    return clear


def clear_caches() -> None:
    """Empty boxwood's caches: the compiled programs of every `filter_jit` wrapper,
    and any other cache registered by boxwood's modules. Best called before
    `jax.clear_caches()`, which empties JAX's own.

    **Arguments:**

    None.

    **Returns:**

    `None`.

    >>> import boxwood
    >>> boxwood.clear_caches()
    """
    for clear in _CLEARS:
        clear()
