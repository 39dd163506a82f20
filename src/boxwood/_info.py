"""`boxwood.info()`: the versions in use."""

from __future__ import annotations

from typing import Any


def info() -> dict[str, Any]:
    """boxwood's version and JAX's.

    **Returns:**

    A dict with `version` (boxwood's) and `jax` (JAX's). Creates no array and
    touches no device.

    >>> import boxwood
    >>> sorted(boxwood.info())
    ['jax', 'version']
    """
    import jax

    from ._version import __version__

    return {"version": __version__, "jax": jax.__version__}
