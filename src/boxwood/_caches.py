"""`clear_caches`: empty boxwood's global caches."""

from __future__ import annotations

from collections.abc import Callable

# Functions that empty one cache each. Modules with a global cache add theirs here
# with `register_cache_clear` at import time.
_CLEARS: list[Callable[[], None]] = []


def register_cache_clear(clear: Callable[[], None]) -> Callable[[], None]:
    """Add `clear` to what [`boxwood.clear_caches`][] runs; returns `clear`."""
    _CLEARS.append(clear)
    return clear


def _clear_jit_stores() -> None:
    # The compiled programs of every live `filter_jit` wrapper (held by the wrapper;
    # the registry of them is weak).
    from ._jit import _cache

    with _cache._STORES_LOCK:
        stores = list(_cache._STORES.values())
    for store in stores:
        store.clear()


register_cache_clear(_clear_jit_stores)


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
