"""Equinox's serialisation API: `tree_serialise_leaves` / `tree_deserialise_leaves`
and their default filter specs, reading and writing Equinox's `.eqx` files.

An `.eqx` file is a plain sequence of NumPy `.npy` records, one per saved leaf, in
flattening order; nothing names them. Three parts here:

- the leaf codec: the record a leaf becomes (`_record_of`) and, for a leaf of
  `like`, which records fit it and what they load as (`_Target`);
- with the default filter specs, the file is walked in Equinox's record layout
  (`_equinox_layout`: the Python scalars that Equinox keeps as leaves and boxwood
  as static fields have records too), one record per slot, checked as it goes;
- with custom filter specs, each leaf's spec reads or writes the file itself and
  the loaded leaf is checked against `like` afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._filters import is_array_like
from .._paths import dotted_path
from .._warnings import user_stacklevel
from ._atomic import atomic_write
from ._equinox_layout import Slot, equinox_slots
from ._error import CheckpointError
from ._format import describe
from ._leaves import is_key_dtype

_PYTHON_SCALARS = (bool, int, float, complex)


def _is_key(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and is_key_dtype(x.dtype)


def _record_of(x: Any) -> np.ndarray | None:
    """The array stored for leaf `x`, or `None` for a leaf that is not stored."""
    if _is_key(x):
        return np.asarray(jax.random.key_data(x))
    if isinstance(x, np.ndarray):
        return x  # written as it is, without a trip through JAX
    if is_array_like(x):
        return np.asarray(x)
    return None


def default_serialise_filter_spec(f: Any, x: Any) -> None:
    """Write one leaf to the open file `f` (the default of `tree_serialise_leaves`).

    JAX and NumPy arrays and Python `bool`/`int`/`float`/`complex` are written with
    `numpy.save` (typed PRNG keys as their key data); other leaves are skipped.

    **Arguments:**

    - `f`: a binary file-like object.
    - `x`: the leaf.

    **Returns:** nothing.
    """
    record = _record_of(x)
    if record is not None:
        np.save(f, record)


@dataclass(frozen=True)
class _Target:
    """What a record must be to load into one leaf of `like`, and how it becomes a
    value of that leaf's kind. A Python scalar (`loose`) takes any 0-d record of
    its dtype's kind (an `int` takes an `int32` record)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    build: Callable[[np.ndarray], Any]
    loose: bool = False

    def view(self, record: np.ndarray) -> np.ndarray:
        # `numpy.save` writes bfloat16 and the other ml_dtypes as raw void (`|V2`).
        if record.dtype.kind == "V" and record.dtype.itemsize == self.dtype.itemsize:
            return record.view(self.dtype)
        return record

    def accepts(self, record: np.ndarray) -> bool:
        record = self.view(record)
        if self.loose:
            return record.shape == () and record.dtype.kind == self.dtype.kind
        return record.shape == self.shape and record.dtype == self.dtype

    def load(self, record: np.ndarray) -> Any:
        return self.build(self.view(record))

    def describe(self) -> str:
        return describe(self.dtype, self.shape)


def _python_scalar(kind: type) -> _Target:
    return _Target((), np.dtype(np.result_type(kind)), lambda r: kind(r.item()), True)


def _target_of(x: Any) -> _Target | None:
    """How leaf `x` of `like` is loaded, or `None` when it is not stored."""
    if _is_key(x):
        impl = x.dtype._impl
        return _Target(
            tuple(x.shape) + tuple(impl.key_shape),
            np.dtype(np.uint32),
            lambda r: jax.random.wrap_key_data(jnp.asarray(r), impl=impl.name),
        )
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return _Target(tuple(x.shape), np.dtype(x.dtype), jnp.asarray)
    if isinstance(x, np.ndarray):
        return _Target(x.shape, x.dtype, lambda r: r)
    if isinstance(x, np.generic):
        return _Target((), x.dtype, lambda r: r[()])
    if isinstance(x, _PYTHON_SCALARS):
        return _python_scalar(type(x))
    if is_array_like(x):  # an object with `__jax_array__`
        as_array = jnp.asarray(x)
        return _Target(tuple(as_array.shape), np.dtype(as_array.dtype), jnp.asarray)
    return None


def default_deserialise_filter_spec(f: Any, x: Any) -> Any:
    """Read the value of one leaf from `f` (the default of `tree_deserialise_leaves`).

    **Arguments:**

    - `f`: a binary file-like object positioned at the leaf's record.
    - `x`: the leaf of `like`.

    **Returns:** the loaded leaf, of `x`'s kind (JAX array, NumPy array, Python
    scalar); `x` itself for leaves that are not saved.
    """
    target = _target_of(x)
    if target is None:
        return x
    return target.load(np.load(f, allow_pickle=False))


# ----------------------------------------------------------------------------- files


def _eqx_path(path: str | os.PathLike) -> pathlib.Path:
    """`path`, with `.eqx` added when it has no suffix."""
    path = pathlib.Path(path)
    return path if path.suffix else path.with_suffix(".eqx")


def _is_path(path_or_file: Any) -> bool:
    return isinstance(path_or_file, (str, os.PathLike))


@contextlib.contextmanager
def _opened_for_reading(path_or_file: Any) -> Iterator[Any]:
    if not _is_path(path_or_file):
        yield path_or_file
        return
    path = _eqx_path(path_or_file)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file.") from None
    with f:
        yield f


def _all_records(f: Any) -> list[np.ndarray]:
    """Every record from `f`'s position to its end."""
    name = str(getattr(f, "name", None) or type(f).__name__)
    records: list[np.ndarray] = []
    while True:
        try:
            records.append(np.load(f, allow_pickle=False))
        except EOFError:  # the clean end of the file
            return records
        except (ValueError, OSError) as e:
            raise CheckpointError(
                f"{name}: record {len(records)} is not a NumPy array record ({e}); "
                "the file is truncated, corrupted, or not an Equinox `.eqx` file."
            ) from None


# ---------------------------------------------------------------------------- errors


class EquinoxLeafError(CheckpointError, RuntimeError):
    """A leaf of an Equinox `.eqx` file that does not load into `like`: a
    `CheckpointError`, and a `RuntimeError` as Equinox raises there."""


def _leaf_error(path: tuple, what: str, mismatch: bool = False) -> CheckpointError:
    """An error that names the leaf by its dotted path first, and ends with JAX's
    key path in the sentence Equinox uses, which code written for Equinox matches:
    one for a leaf that does not fit `like` (`mismatch`), one for any other."""
    name = dotted_path(path) or "<root>"
    if mismatch:
        return EquinoxLeafError(
            f"`{name}`: {what} Deserialised leaf at path {path!r} does not match "
            "`like`."
        )
    return EquinoxLeafError(f"`{name}`: {what} Error at leaf with path {path!r}.")


_STATEFUL_WORDS = ("BatchNorm", "state_index", "first_time_index", "batch_counter")
_MODE_HINT = (
    " A stateful layer stores different state in each mode: build `like` with the "
    "saved layer's mode (Equinox's `BatchNorm` defaults to mode='ema', boxwood's to "
    "mode='torch')."
)
_LAYOUT_DIFFERS = (
    "The saved model's layout differs here: build `like` with the same layers and "
    "sizes."
)


def _misfit(path: tuple, index: int, record: np.ndarray, target: _Target) -> Exception:
    """The record at `index` does not fit the leaf at `path`."""
    record = target.view(record)
    stateful = any(word in dotted_path(path) for word in _STATEFUL_WORDS)
    return _leaf_error(
        path,
        f"the file's next array (record {index}) is "
        f"{describe(record.dtype, record.shape)}, `like` expects {target.describe()}. "
        + _LAYOUT_DIFFERS
        + (_MODE_HINT if stateful else ""),
        mismatch=True,
    )


# ------------------------------------------------------- loading in Equinox's layout


def _check_scalar_record(slot: Slot, index: int, record: np.ndarray) -> None:
    """The record of a field that Equinox keeps as a leaf and boxwood static: it
    must be a 0-d number; `like`'s value stays, with a warning if the file's
    differs."""
    if record.shape != () or record.dtype.kind not in "biuf":
        raise _leaf_error(
            slot.path,
            "Equinox stores this Python scalar as a leaf, but the file's record "
            f"{index} is {describe(record.dtype, record.shape)}. {_LAYOUT_DIFFERS}",
            mismatch=True,
        )
    saved = record.item()
    if saved == slot.value:
        return
    name = dotted_path(slot.path)
    field = slot.path[-1].name
    warnings.warn(
        f"`{name}`: the file holds {saved!r}, `like` has {slot.value!r}. boxwood "
        "keeps this field static, so the loaded model keeps `like`'s value: "
        f"build `like` with {field}={saved!r} to use the saved one.",
        stacklevel=user_stacklevel(),
    )


def _plan(like: Any, n_records: int, is_leaf: Callable | None) -> list[tuple]:
    """`(slot, target)` for every slot of `like`, `target` `None` where the file
    holds no record (a scalar slot always has one: `_equinox_layout` checks it).

    A file holding exactly one record fewer per scalar slot was written by an
    earlier boxwood, which stored arrays only: its plan has no scalar slots."""
    plan = [(s, _target_of(s.value)) for s in equinox_slots(like, is_leaf)]
    scalars = sum(slot.scalar for slot, _ in plan)
    arrays = sum(not slot.scalar and t is not None for slot, t in plan)
    if scalars and n_records == arrays:
        return [(slot, t) for slot, t in plan if not slot.scalar]
    return plan


def _load_in_layout(like: Any, records: list[np.ndarray], is_leaf: Any) -> Any:
    """`like` filled from `records`, taken in order, one per stored slot; a record
    that does not fit its slot, or a count that differs, is an error."""
    pending = iter(enumerate(records))
    leaves = []
    for slot, target in _plan(like, len(records), is_leaf):
        if target is None:  # code or configuration: kept from `like`
            leaves.append(slot.value)
            continue
        taken = next(pending, None)
        if taken is None:
            raise _leaf_error(
                slot.path,
                f"the file has no array left for it ({target.describe()}); it holds "
                "fewer leaves than `like`.",
            )
        index, record = taken
        if slot.scalar:  # static in boxwood: checked, not loaded
            _check_scalar_record(slot, index, record)
        elif target.accepts(record):
            leaves.append(target.load(record))
        else:
            raise _misfit(slot.path, index, record, target)
    extra = [record for _, record in pending]
    if extra:
        raise CheckpointError(
            f"The file holds {len(extra)} more array(s) than `like` has leaves (the "
            f"first is {describe(extra[0].dtype, extra[0].shape)}): the saved model "
            "is larger than `like`."
        )
    return jtu.tree_unflatten(jtu.tree_structure(like, is_leaf=is_leaf), leaves)


# ------------------------------------------------------------ custom filter specs


def _with_specs(filter_spec: Any, tree: Any, is_leaf: Callable | None) -> list[tuple]:
    """`(spec, path, leaf)` for every leaf of `tree`, in order; `filter_spec` is one
    function or a pytree of functions that is a prefix of `tree`, each applying to
    the leaves of the subtree at its place."""
    out: list[tuple] = []

    def expand(prefix: tuple, spec: Callable, subtree: Any) -> None:
        for path, leaf in jtu.tree_flatten_with_path(subtree, is_leaf=is_leaf)[0]:
            out.append((spec, prefix + path, leaf))

    jtu.tree_map_with_path(expand, filter_spec, tree)
    return out


def _kind(x: Any, *, like: bool = False) -> tuple[Any, str]:
    """The kind of leaf a loaded value must match, and its name in messages; in
    `like`, an abstract array stands for a JAX array."""
    if isinstance(x, jax.Array) or (like and isinstance(x, jax.ShapeDtypeStruct)):
        return jax.Array, "a JAX array"
    return type(x), f"a {type(x).__name__}"


def _array_text(x: Any) -> str:
    return str(x.dtype) if _is_key(x) else describe(x.dtype, x.shape)


def _check_loaded(path: tuple, new: Any, old: Any) -> None:
    """A leaf loaded by a custom filter spec must be of `like`'s leaf's kind, and
    an array of its shape and dtype."""
    (new_kind, new_name), (old_kind, old_name) = _kind(new), _kind(old, like=True)
    if new_kind is not old_kind:
        raise _leaf_error(path, f"loaded {new_name}, `like` has {old_name}.", True)
    if isinstance(new, (np.ndarray, jax.Array)) and (
        (new.shape, new.dtype) != (old.shape, old.dtype)
    ):
        raise _leaf_error(
            path,
            f"the file has {_array_text(new)}, `like` expects {_array_text(old)}.",
            mismatch=True,
        )


# ---------------------------------------------------------------------- the API


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

    With the default `filter_spec`, the static fields that Equinox keeps as leaves
    (`Dropout.p`, `inference` flags, pooling `init`) are written where Equinox
    writes them. A layer of your own declares such fields with the class attribute
    `equinox_scalar_fields`, a tuple of field names in Equinox's order (default
    `()`: none).

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
    if filter_spec is default_serialise_filter_spec:
        slots = equinox_slots(pytree, is_leaf)
        jobs = [(filter_spec, slot.path, slot.value) for slot in slots]
    else:
        jobs = _with_specs(filter_spec, pytree, is_leaf)

    def write_all(f: Any) -> None:
        for spec, path, leaf in jobs:
            try:
                spec(f, leaf)
            except Exception as e:
                raise _leaf_error(path, f"could not be saved: {e}") from e

    if _is_path(path_or_file):
        atomic_write(_eqx_path(path_or_file), write_all)
    else:
        write_all(path_or_file)


def _load_with_specs(f: Any, like: Any, filter_spec: Any, is_leaf: Any) -> Any:
    leaves = []
    for spec, path, old in _with_specs(filter_spec, like, is_leaf):
        try:
            new = spec(f, old)
        except Exception as e:
            raise _leaf_error(path, f"could not be loaded: {e}") from e
        _check_loaded(path, new, old)
        leaves.append(new)
    return jtu.tree_unflatten(jtu.tree_structure(like, is_leaf=is_leaf), leaves)


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
    with _opened_for_reading(path_or_file) as f:
        if filter_spec is default_deserialise_filter_spec:
            return _load_in_layout(like, _all_records(f), is_leaf)
        return _load_with_specs(f, like, filter_spec, is_leaf)
