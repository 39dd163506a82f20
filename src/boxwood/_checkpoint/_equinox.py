"""Equinox's serialisation API: `tree_serialise_leaves` / `tree_deserialise_leaves`
and their default filter specs, reading and writing Equinox's `.eqx` files.

An `.eqx` file is the tree's leaves, in flattening order, each written by
`numpy.save` (arrays and Python `bool`/`int`/`float`/`complex`); nothing names
the leaves. With the default filter specs, both directions follow Equinox's record
layout exactly (`_equinox_layout`): the Python scalars that Equinox keeps as leaves
and boxwood as static fields (`Dropout.p`, `BatchNorm.inference`, ...) have their
own records, and every record is matched to its slot by position alone; a record
that does not fit its slot is an error naming the leaf and why.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._filters import is_array_like
from .._paths import dotted_path
from .._warnings import user_stacklevel
from ._atomic import atomic_write
from ._equinox_layout import equinox_slots
from ._error import CheckpointError
from ._format import describe
from ._leaves import is_key_dtype


def _is_key(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and is_key_dtype(x.dtype)


def default_serialise_filter_spec(f: Any, x: Any) -> None:
    """Write one leaf to the open file `f` (the default of `tree_serialise_leaves`).

    JAX and NumPy arrays and Python `bool`/`int`/`float`/`complex` are written with
    `numpy.save` (typed PRNG keys as their key data); other leaves are skipped.

    **Arguments:**

    - `f`: a binary file-like object.
    - `x`: the leaf.

    **Returns:** nothing.
    """
    if _is_key(x):
        np.save(f, np.asarray(jax.random.key_data(x)))
    elif isinstance(x, np.ndarray):
        np.save(f, x)  # kept a NumPy array: no round trip through JAX
    elif isinstance(x, jax.Array) or is_array_like(x):
        np.save(f, np.asarray(x))


def default_deserialise_filter_spec(f: Any, x: Any) -> Any:
    """Read the value of one leaf from `f` (the default of `tree_deserialise_leaves`).

    **Arguments:**

    - `f`: a binary file-like object positioned at the leaf's record.
    - `x`: the leaf of `like`.

    **Returns:** the loaded leaf, of `x`'s kind (JAX array, NumPy array, Python
    scalar); `x` itself for leaves that are not saved.
    """
    if not (isinstance(x, jax.ShapeDtypeStruct) or is_array_like(x)):
        return x
    return _convert(np.load(f, allow_pickle=False), x)


def _want(x: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a record must have to load into leaf `x`."""
    if _is_key(x):
        return tuple(x.shape) + tuple(x.dtype._impl.key_shape), np.dtype(np.uint32)
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
        return tuple(x.shape), np.dtype(x.dtype)
    return (), np.dtype(np.result_type(type(x)))  # a Python scalar


def _as_dtype(record: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # numpy.save writes bfloat16 and other ml_dtypes as raw void records (`|V2`).
    if record.dtype.kind == "V" and record.dtype.itemsize == dtype.itemsize:
        return record.view(dtype)
    return record


def _fits(record: np.ndarray, x: Any) -> bool:
    shape, dtype = _want(x)
    record = _as_dtype(record, dtype)
    if isinstance(x, (bool, int, float, complex)):  # Python scalar: its kind only
        return record.shape == () and dtype.kind == record.dtype.kind
    return record.shape == shape and record.dtype == dtype


def _convert(record: np.ndarray, x: Any) -> Any:
    record = _as_dtype(record, _want(x)[1])
    if _is_key(x):
        return jax.random.wrap_key_data(jnp.asarray(record), impl=x.dtype._impl.name)
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return jnp.asarray(record)
    if isinstance(x, np.ndarray):
        return record
    if isinstance(x, np.generic):
        return record[()]
    return type(x)(record.item())


def _with_suffix(path: str | os.PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    return path.with_suffix(".eqx") if path.suffix == "" else path


def _spec_leaves(
    filter_spec: Any, tree: Any, is_leaf: Callable | None
) -> Iterator[tuple[Callable, tuple, Any]]:
    """`(spec, path, leaf)` for every leaf of `tree`, with `filter_spec` a function or
    a pytree of functions that is a prefix of `tree`."""
    specs, spec_def = jtu.tree_flatten_with_path(filter_spec)
    subtrees = spec_def.flatten_up_to(tree)
    for (prefix, spec), subtree in zip(specs, subtrees):
        for path, leaf in jtu.tree_flatten_with_path(subtree, is_leaf=is_leaf)[0]:
            yield spec, prefix + path, leaf


class EquinoxLeafError(CheckpointError, RuntimeError):
    """A leaf of an Equinox `.eqx` file that does not load into `like`: a
    `CheckpointError`, and a `RuntimeError` as Equinox raises there."""


def _leaf_error(path: tuple, what: str, mismatch: bool = False) -> CheckpointError:
    """Names the leaf by its dotted path, then by JAX's key path in the words of
    Equinox's own error (so code matching Equinox's message keeps working)."""
    if mismatch:
        tail = f"Deserialised leaf at path {path!r} does not match `like`."
    else:
        tail = f"Error at leaf with path {path!r}."
    return EquinoxLeafError(f"`{dotted_path(path) or '<root>'}`: {what} {tail}")


def tree_serialise_leaves(
    path_or_file: str | os.PathLike | Any,
    pytree: Any,
    filter_spec: Any = default_serialise_filter_spec,
    is_leaf: Callable[[Any], bool] | None = None,
) -> None:
    """Save the leaves of `pytree` in Equinox's `.eqx` format.

    Files written here load with `equinox.tree_deserialise_leaves` and the other
    way round. A path is written crash-safely (temporary file, fsync, rename).
    For new code, [`boxwood.save`][] stores names, metadata and a fingerprint too.

    **Arguments:**

    - `path_or_file`: a path (`.eqx` is added when it has no suffix) or a binary
      file-like object.
    - `pytree`: the tree to save.
    - `filter_spec`: `(file, leaf) -> None`, saving a leaf or not, or a pytree of
      such functions that is a prefix of `pytree`.
    - `is_leaf`: as in `jax.tree_util`.

    **Returns:** nothing.

    >>> import io, jax.numpy as jnp, boxwood
    >>> buffer = io.BytesIO()
    >>> boxwood.tree_serialise_leaves(buffer, {"w": jnp.ones(2), "n": 3})
    >>> _ = buffer.seek(0)
    >>> boxwood.tree_deserialise_leaves(buffer, {"w": jnp.zeros(2), "n": 0})
    {'n': 3, 'w': Array([1., 1.], dtype=float32)}
    """

    def write(f: Any) -> None:
        if filter_spec is default_serialise_filter_spec:  # Equinox's exact layout
            leaves = [
                (filter_spec, s.path, s.value) for s in equinox_slots(pytree, is_leaf)
            ]
        else:
            leaves = _spec_leaves(filter_spec, pytree, is_leaf)
        for spec, path, leaf in leaves:
            try:
                spec(f, leaf)
            except Exception as e:
                raise _leaf_error(path, f"could not be saved: {e}") from e

    if isinstance(path_or_file, (str, os.PathLike)):
        atomic_write(_with_suffix(path_or_file), write)
    else:
        write(path_or_file)


@contextlib.contextmanager
def _open(path_or_file: Any) -> Iterator[Any]:
    if isinstance(path_or_file, (str, os.PathLike)):
        path = _with_suffix(path_or_file)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such file.") from None
        with f:
            yield f
    else:
        yield path_or_file


def _records(f: Any, name: str) -> list[np.ndarray]:
    records = []
    while True:
        try:
            records.append(np.load(f, allow_pickle=False))
        except EOFError:
            return records
        except (ValueError, OSError) as e:
            raise CheckpointError(
                f"{name}: record {len(records)} is not a NumPy array record ({e}); "
                "the file is truncated, corrupted, or not an Equinox `.eqx` file."
            ) from None


def _stored(slot: Any) -> bool:
    """Whether the file holds a record for `slot`."""
    return (
        slot.scalar
        or isinstance(slot.value, jax.ShapeDtypeStruct)
        or is_array_like(slot.value)
    )


def _layout(like: Any, n_records: int, is_leaf: Callable | None) -> list:
    """The slots of `like` (see `_equinox_layout`): Equinox's layout, with its
    scalar leaves; or, for a file holding exactly those records fewer, the layout
    of files written by boxwood before it wrote them."""
    slots = equinox_slots(like, is_leaf)
    with_scalars = sum(map(_stored, slots))
    n_scalars = sum(s.scalar for s in slots)
    if n_scalars and n_records == with_scalars - n_scalars:
        return [s for s in slots if not s.scalar]
    return slots


def _aligned(like: Any, records: list[np.ndarray], is_leaf: Callable | None) -> Any:
    """Load `records` into `like`, one record per slot, in order: a record that does
    not fit its slot is an error."""
    out, i = [], 0
    for slot in _layout(like, len(records), is_leaf):
        if not _stored(slot):
            out.append(slot.value)
            continue
        if i == len(records):
            shape, dtype = _want(slot.value)
            raise _leaf_error(
                slot.path,
                f"the file has no array left for it ({describe(dtype, shape)}); it holds fewer leaves than `like`.",
            )
        if slot.scalar:
            _check_scalar(slot, records[i], i)
        elif not _fits(records[i], slot.value):
            raise _mismatch(slot, records[i], i)
        else:
            out.append(_convert(records[i], slot.value))
        i += 1
    if i < len(records):
        rest = records[i:]
        raise CheckpointError(
            f"The file holds {len(rest)} more array(s) than `like` has leaves (the "
            f"first is {describe(rest[0].dtype, rest[0].shape)}): the saved model is "
            "larger than `like`."
        )
    return jtu.tree_unflatten(jtu.tree_structure(like, is_leaf=is_leaf), out)


_MODE_HINT = (
    " A stateful layer stores different state in each mode: build `like` with the "
    "saved layer's mode (Equinox's `BatchNorm` defaults to mode='ema', boxwood's to "
    "mode='torch')."
)


def _mismatch(slot: Any, record: np.ndarray, i: int) -> CheckpointError:
    shape, dtype = _want(slot.value)
    rec = _as_dtype(record, dtype)
    name = dotted_path(slot.path)
    stateful = ("BatchNorm", "state_index", "first_time_index", "batch_counter")
    hint = _MODE_HINT if any(word in name for word in stateful) else ""
    return _leaf_error(
        slot.path,
        f"the file's next array (record {i}) is {describe(rec.dtype, rec.shape)}, "
        f"`like` expects {describe(dtype, shape)}. The saved model's layout differs "
        f"here: build `like` with the same layers and sizes.{hint}",
        mismatch=True,
    )


def _check_scalar(slot: Any, record: np.ndarray, i: int) -> None:
    """A record of a Python scalar that Equinox keeps as a leaf and boxwood static:
    it must be one; `like`'s value is kept, with a warning if the file's differs."""
    if record.shape != () or record.dtype.kind not in "biuf":
        raise _leaf_error(
            slot.path,
            f"Equinox stores this Python scalar as a leaf, but the file's record {i} "
            f"is {describe(record.dtype, record.shape)}. The saved model's layout "
            "differs here: build `like` with the same layers and sizes.",
            mismatch=True,
        )
    saved = record.item()
    if saved != slot.value:
        name = dotted_path(slot.path)
        field = name.rsplit(".", 1)[-1]
        warnings.warn(
            f"`{name}`: the file holds {saved!r}, `like` has {slot.value!r}. boxwood "
            f"keeps this field static, so the loaded model keeps `like`'s value: "
            f"build `like` with {field}={saved!r} to use the saved one.",
            stacklevel=user_stacklevel(),
        )


def _check_like(path: tuple, new: Any, old: Any) -> None:
    if isinstance(old, jax.ShapeDtypeStruct) or isinstance(old, jax.Array):
        if not isinstance(new, jax.Array):
            raise _leaf_error(
                path,
                f"loaded a {type(new).__name__}, `like` has a JAX array.",
                mismatch=True,
            )
    elif type(new) is not type(old):
        raise _leaf_error(
            path,
            f"loaded a {type(new).__name__}, `like` has a {type(old).__name__}.",
            mismatch=True,
        )
    if isinstance(new, (np.ndarray, jax.Array)) and (
        new.shape != old.shape or new.dtype != old.dtype
    ):
        raise _leaf_error(
            path,
            f"the file has {describe(new.dtype, new.shape) if not _is_key(new) else new.dtype}, "
            f"`like` expects {describe(old.dtype, old.shape) if not _is_key(old) else old.dtype}.",
            mismatch=True,
        )


def tree_deserialise_leaves(
    path_or_file: str | os.PathLike | Any,
    like: Any,
    filter_spec: Any = default_deserialise_filter_spec,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Load a tree saved in Equinox's `.eqx` format into `like`'s structure.

    Loads files written by `equinox.tree_serialise_leaves`, so a model trained with
    Equinox moves to the equivalent boxwood model. With the default `filter_spec`,
    records are matched to `like` by position, exactly as Equinox does. The Python
    scalars that Equinox saves as leaves and boxwood keeps static (such as
    `Dropout.p` or `BatchNorm.inference`) keep `like`'s value, with a warning where
    the file's differs; any record that does not fit its leaf raises a
    [`boxwood.CheckpointError`][] naming the leaf and the shapes.

    **Arguments:**

    - `path_or_file`: a path (`.eqx` is added when it has no suffix) or a binary
      file-like object with `read` and `seek`.
    - `like`: a tree of the same structure (real, or abstract from
      [`boxwood.filter_eval_shape`][]).
    - `filter_spec`: `(file, leaf) -> new_leaf`, or a pytree of such functions that
      is a prefix of `like`.
    - `is_leaf`: as in `jax.tree_util`.

    **Returns:** the loaded tree.
    """
    with _open(path_or_file) as f:
        name = getattr(f, "name", None) or type(f).__name__
        if filter_spec is default_deserialise_filter_spec:
            return _aligned(like, _records(f, str(name)), is_leaf)
        pairs, treedef = jtu.tree_flatten_with_path(like, is_leaf=is_leaf)
        out = []
        for spec, path, leaf in _spec_leaves(filter_spec, like, is_leaf):
            try:
                out.append(spec(f, leaf))
            except Exception as e:
                raise _leaf_error(path, f"could not be loaded: {e}") from e
    for (path, old), new in zip(pairs, out):
        _check_like(path, new, old)
    return jtu.tree_unflatten(treedef, out)
