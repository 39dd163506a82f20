"""`save`: a tree's arrays to one safetensors file, crash-safely, or to an orbax
directory (see `_load.py` for `load`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import _background
from ._safetensors import (
    check_savable,
    encode_metadata,
    to_host,
    write_file,
)

_FORMATS = ("safetensors", "orbax", None)


def check_format(format: Any) -> None:
    if format not in _FORMATS:
        raise ValueError(
            f'`format` must be "safetensors", "orbax" or None (choose by the '
            f"tree), got {format!r}."
        )


def save(
    path: str | os.PathLike,
    tree: Any,
    *,
    metadata: dict | None = None,
    blocking: bool = True,
    format: str | None = None,
) -> _background.SaveHandle | None:
    """Save the arrays of `tree` to a `.safetensors` file, crash-safely.

    Each array leaf is stored under its dotted key path (`encoder.layers.0.weight`;
    `1.0.mu.layers.0.bias` for an optax state inside a tuple). Non-array leaves
    (functions, Python numbers, strings) are part of the code, not the checkpoint,
    and are not stored. The file is written next to `path` and renamed over it, so
    `path` always holds either the old checkpoint or the complete new one.

    **Arguments:**

    - `path`: the file to write (its directory must exist).
    - `tree`: any pytree: a module, an `nn.State`, an optax state, or a tuple of
      them (a whole training checkpoint).
    - `metadata`: a JSON-serialisable dict stored in the file (step,
      hyperparameters); read it back with [`boxwood.read_metadata`][].
    - `blocking`: if `False`, return as soon as every array is on the host (NumPy
      leaves copied; a `jax.Array`'s host view held, which JAX never reuses while
      it is held) and write the file in the background.
    - `format`: `"safetensors"` (one file), `"orbax"` (a directory written by
      orbax-checkpoint, for trees spread over several processes), or `None` to
      choose orbax exactly when the tree spans several processes.

    **Returns:** `None`, or with `blocking=False` a handle with `.wait()` and
    `.done()`. A background save's error is raised by `.wait()` and by the next
    save; a later save and process exit wait for it.

    >>> import tempfile, os, jax.numpy as jnp, boxwood
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> boxwood.save(path, {"w": jnp.ones(3), "act": "relu"}, metadata={"step": 7})
    >>> boxwood.read_metadata(path)
    {'step': 7}
    """
    check_format(format)
    _background.wait_all()
    if wants_orbax(tree, format):
        from ._orbax import save_orbax

        return save_orbax(path, tree, metadata=metadata, blocking=blocking)
    return save_file(path, tree, metadata, blocking)


def save_file(
    path: Any,
    tree: Any,
    metadata: dict | None,
    blocking: bool,
    then: Callable[[], None] | None = None,
) -> _background.SaveHandle | None:
    """Write `tree` to the safetensors file `path`, then call `then` (if given)."""
    leaves = check_savable(tree)
    meta = encode_metadata(leaves, metadata)
    arrays = to_host(leaves, copy=not blocking)  # background: nothing shared

    def write() -> None:
        write_file(path, arrays, meta)
        if then is not None:
            then()

    if blocking:
        write()
        return None
    return _background.start(path, write)


def wants_orbax(tree: Any, format: str | None) -> bool:
    if format is not None:
        return format == "orbax"
    import jax

    # Only arrays that span several processes need orbax; a tree of NumPy arrays
    # does not start JAX's backend here.
    return any(
        isinstance(x, jax.Array) and not x.is_fully_addressable
        for x in jax.tree_util.tree_leaves(tree)
    )
