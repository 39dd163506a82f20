"""`load`: a checkpoint into a tree of `like`'s structure, validated first;
`read_metadata`: the user's metadata of a checkpoint."""

from __future__ import annotations

import os
from typing import Any

from . import _background
from ._format import read_header
from ._load_file import load_file
from ._safetensors import decode_user_metadata
from ._save import check_format


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
