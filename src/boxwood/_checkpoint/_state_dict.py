"""`state_dict` and `load_state_dict`: a tree's arrays as a flat dict of NumPy arrays,
and back, with renaming for weights from other libraries (PyTorch)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import ml_dtypes
import numpy as np

from ._assemble import LoadReport, assemble
from ._error import CheckpointError
from ._format import read_header
from ._safetensors import FileTensor, check_savable, file_tensors, to_host


def state_dict(tree: Any) -> dict[str, np.ndarray]:
    """The arrays of `tree` by dotted key path, as NumPy arrays on the host.

    Typed PRNG keys appear as their key data (`uint32`). Non-array leaves are left
    out.

    **Arguments:**

    - `tree`: any pytree (module, `nn.State`, optax state, tuples of them).

    **Returns:** a dict from dotted name to `numpy.ndarray`, in leaf order.

    >>> import boxwood, jax.numpy as jnp
    >>> boxwood.state_dict({"layer": {"w": jnp.ones(2)}, "act": jnp.tanh})
    {'layer.w': array([1., 1.], dtype=float32)}
    """
    return dict(to_host(check_savable(tree), copy=True))


def _to_numpy(name: str, value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch.Tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            # NumPy has no bfloat16 of its own; float32 holds every bfloat16 exactly.
            return value.float().numpy().astype(ml_dtypes.bfloat16)
        return value.numpy()
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return np.asarray(value)
    raise CheckpointError(
        f"`state_dict[{name!r}]` is a {type(value).__name__}, not an array (NumPy, "
        "JAX or PyTorch)."
    )


@dataclass
class ArrayTensor:
    """An in-memory array presented as a checkpoint tensor (as `assemble` reads
    one)."""

    array: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray:
        return self.array if index is None else self.array[index]


def _renamed(
    incoming: Mapping[str, Any],
    key_map: Mapping[str, str] | Callable[[str], str | None] | None,
) -> dict[str, ArrayTensor | FileTensor]:
    if key_map is None:
        rename: Callable[[str], str | None] = lambda k: k
    elif callable(key_map):
        rename = key_map
    elif isinstance(key_map, Mapping):
        rename = lambda k: key_map.get(k, k)
    else:
        raise TypeError(
            "`key_map` must be a dict (incoming name -> boxwood name) or a function "
            f"of the incoming name, got {type(key_map).__name__}."
        )
    out: dict[str, ArrayTensor | FileTensor] = {}
    origin: dict[str, str] = {}
    for key, value in incoming.items():
        new = rename(key)
        if new is None:  # the key map drops this entry
            continue
        if not isinstance(new, str):
            raise TypeError(
                f"`key_map` must give a string (or None to drop the entry) for "
                f"{key!r}, got {new!r}."
            )
        if new in out:
            raise CheckpointError(
                f"`key_map` gives two incoming keys the same name {new!r}: "
                f"{origin[new]!r} and {key!r}."
            )
        origin[new] = key
        out[new] = (
            value
            if isinstance(value, FileTensor)
            else ArrayTensor(_to_numpy(key, value))
        )
    return out


def load_state_dict(
    tree: Any,
    state_dict: Mapping[str, Any],
    *,
    strict: bool = True,
    key_map: Mapping[str, str] | Callable[[str], str | None] | None = None,
) -> tuple[Any, LoadReport]:
    """Fill the arrays of `tree` from a flat dict of arrays, validating everything.

    The dict may come from [`boxwood.state_dict`][], from a safetensors file
    (`safetensors.numpy.load_file`), or from PyTorch (`module.state_dict()`, or a
    file saved with `safetensors.torch.save_file`). All problems are reported at
    once in one [`boxwood.CheckpointError`][]. An incoming array whose shape
    differs from the leaf's only by axes of size 1 (PyTorch's `(C,)` convolution
    bias for boxwood's `(C, 1, 1)`) is reshaped; dtypes must match exactly.

    **Arguments:**

    - `tree`: the tree to fill (real or abstract); its structure is kept.
    - `state_dict`: incoming name -> array (NumPy, JAX or `torch.Tensor`), or the
      path of a safetensors file (read lazily: only the tensors kept are read).
    - `strict`: if `False`, leaves without an incoming array keep their value and
      incoming arrays without a leaf are ignored; both are listed in the report.
    - `key_map`: renames incoming keys to boxwood's dotted key paths: a dict
      (`{"0.weight": "layers.0.weight"}`; unlisted keys keep their name) or a
      function of the incoming name. A new name of `None` drops the entry.

    **Returns:** `(new_tree, report)`, where `report.missing_keys` and
    `report.unexpected_keys` list what did not match (empty when strict).

    >>> import boxwood, numpy as np, jax.numpy as jnp
    >>> tree = {"layers": [{"weight": jnp.zeros(2)}]}
    >>> new, report = boxwood.load_state_dict(
    ...     tree, {"0.weight": np.ones(2, np.float32)},
    ...     key_map={"0.weight": "layers.0.weight"})
    >>> new["layers"][0]["weight"]
    Array([1., 1.], dtype=float32)
    """
    source = where = "the state dict"
    if isinstance(state_dict, (str, os.PathLike)):
        path = os.fspath(state_dict)
        state_dict = file_tensors(path, read_header(path))
        source, where = f"the file {path}", "the file"
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            "`state_dict` must be a dict of arrays or the path of a safetensors file, "
            f"got {type(state_dict).__name__}."
        )
    tensors = _renamed(state_dict, key_map)
    return assemble(
        tree,
        tensors,
        strict=strict,
        squeeze_ok=True,
        source=source,
        where=where,
        hint=lambda r: _KEY_MAP_HINT if r.missing_keys or r.unexpected_keys else "",
    )


_KEY_MAP_HINT = (
    "Where names differ (weights from another library), rename the incoming keys "
    "with `key_map=` (a dict or a function; see docs/checkpoints.md). "
    "`boxwood.state_dict(tree)` lists the names the tree expects."
)
