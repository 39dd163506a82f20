"""The public entry points: `save`, `load`, `read_metadata`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import _background
from ._format import read_header
from ._load_file import load_file
from ._save_load import (
    check_savable,
    decode_user_metadata,
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


def load(
    path: str | os.PathLike,
    like: Any,
    *,
    strict: bool = True,
    dtype: Any = None,
    format: str | None = None,
) -> Any:
    """Load a checkpoint into a tree with `like`'s structure, validating everything.

    Every problem is found before anything is loaded, and all of them are reported
    together in one [`boxwood.CheckpointError`][]: missing keys, unexpected keys,
    shape mismatches (`encoder.weight: file has f32[64,32], model expects
    f32[64,16]`) and dtype mismatches.

    **Arguments:**

    - `path`: a file written by [`boxwood.save`][] (or any safetensors file whose
      tensor names are the tree's dotted key paths).
    - `like`: a tree of the structure to load: a real one, or an abstract one from
      [`boxwood.filter_eval_shape`][] so that a large model is never allocated
      twice. Where `like`'s leaves carry a sharding, each array is placed with it
      and each device reads only its own part of the file.
    - `strict`: if `False`, leaves missing from the file keep `like`'s value and
      tensors the tree lacks are ignored (shapes and dtypes are still checked).
    - `dtype`: a floating-point dtype to cast floating-point arrays to. Without it
      a dtype mismatch is an error: nothing is cast silently.
    - `format`: as in [`boxwood.save`][]; `None` reads a directory with orbax and a
      file as safetensors.

    **Returns:** the loaded tree. NumPy leaves of `like` come back as NumPy arrays,
    other array leaves as `jax.Array`s; non-array leaves are `like`'s.

    >>> import tempfile, os, jax.numpy as jnp, boxwood
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> boxwood.save(path, {"w": jnp.ones(3)})
    >>> boxwood.load(path, {"w": jnp.zeros(3)})
    {'w': Array([1., 1., 1.], dtype=float32)}
    >>> boxwood.load(path, {"w": jnp.zeros(4), "b": jnp.zeros(2)})
    Traceback (most recent call last):
    ...
    boxwood.CheckpointError: Cannot load the checkpoint ... (2 problems):
      - b: missing from the file
      - w: file has f32[3], model expects f32[4]
    ...
    """
    check_format(format)
    _background.wait_all()
    if format == "orbax" or (format is None and os.path.isdir(path)):
        from ._orbax import load_orbax

        return load_orbax(path, like, strict=strict, dtype=dtype)
    return load_file(path, like, strict=strict, dtype=dtype)


def read_metadata(path: str | os.PathLike) -> dict:
    """The user metadata saved with a checkpoint (the `metadata=` of `save`).

    Reads only the file's header. **Raises** [`boxwood.CheckpointError`][] if the
    file is missing, truncated or not a safetensors file.

    **Returns:** the metadata dict (empty if none was given).
    """
    _background.wait_all()
    if os.path.isdir(path):
        from ._orbax import read_orbax_metadata

        return read_orbax_metadata(path)
    path = os.fspath(path)
    return decode_user_metadata(path, read_header(path))


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
