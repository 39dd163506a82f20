"""Checkpoints of trees spread over several processes, through orbax-checkpoint.

One process cannot write a `.safetensors` file of arrays it does not hold, so such
trees go to orbax-checkpoint, the JAX ecosystem's distributed checkpoint engine
(every process writes its own shards; all processes call `save`/`load` together).
boxwood keeps its own conventions on top: the arrays are stored as a flat dict
keyed by their dotted names (item `state`), boxwood's metadata (version,
fingerprint, user metadata, key impls) is a JSON item (`meta`), and a load is
validated all at once, from orbax's metadata, before any array is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from . import _background
from ._assemble import Plan, assemble, sharding_of
from ._error import CheckpointError
from ._leaves import stored_leaves
from ._load_file import check_keys, fingerprint_hint
from ._safetensors import USER_KEY, encode_metadata

_MISSING = (
    "Saving or loading a tree that spans several processes needs orbax-checkpoint: "
    "`pip install 'boxwood[orbax]'` (or `pip install orbax-checkpoint`)."
)


def orbax_checkpoint() -> Any:
    """The `orbax.checkpoint` module, imported on first use (an optional extra)."""
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError(_MISSING) from None
    return ocp


def _handler(ocp: Any) -> Any:
    return ocp.CompositeCheckpointHandler(
        state=ocp.PyTreeCheckpointHandler(), meta=ocp.JsonCheckpointHandler()
    )


def _flat(tree: Any) -> tuple[list, dict[str, Any]]:
    leaves, _, _ = stored_leaves(tree)
    for leaf in leaves:
        if isinstance(leaf.value, jax.ShapeDtypeStruct):
            raise CheckpointError(
                f"Cannot save `{leaf.name}`: it is an abstract `jax.ShapeDtypeStruct`, "
                "not an array."
            )
    flat = {
        leaf.name: jax.random.key_data(leaf.value) if leaf.key_impl else leaf.value
        for leaf in leaves
    }
    return leaves, flat


def save_orbax(
    path: Any,
    tree: Any,
    *,
    metadata: dict | None,
    blocking: bool,
    then: Callable[[], None] | None = None,
) -> _background.SaveHandle | None:
    """Save `tree` to the directory `path` with orbax (every process must call it),
    then call `then` (if given; in the background thread when not blocking)."""
    ocp = orbax_checkpoint()
    leaves, flat = _flat(tree)
    meta = encode_metadata(leaves, metadata)
    args = ocp.args.Composite(
        state=ocp.args.PyTreeSave(flat), meta=ocp.args.JsonSave(meta)
    )
    path = os.path.abspath(os.fspath(path))
    if blocking:
        ocp.Checkpointer(_handler(ocp)).save(path, args=args, force=True)
        if then is not None:
            then()
        return None
    # orbax copies the arrays off the devices before `save` returns, then writes in
    # its own threads; boxwood's handle waits for those and keeps their error.
    checkpointer = ocp.AsyncCheckpointer(_handler(ocp))
    checkpointer.save(path, args=args, force=True)

    def finish() -> None:
        checkpointer.wait_until_finished()
        if then is not None:
            then()

    return _background.start(path, finish)


class _OrbaxTensor:
    """An array of an orbax checkpoint, known from its metadata only."""

    def __init__(self, shape: tuple[int, ...], dtype: Any):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)

    def read(self, index: Any = None) -> np.ndarray:  # pragma: no cover - see below
        raise AssertionError("orbax checkpoints are read by `_restore`, all at once")


def item_metadata(path: str) -> tuple[dict, dict]:
    ocp = orbax_checkpoint()
    checkpointer = ocp.Checkpointer(_handler(ocp))
    try:
        state = checkpointer.metadata(path).item_metadata["state"].tree
        tensors = {name: _OrbaxTensor(m.shape, m.dtype) for name, m in state.items()}
        meta = checkpointer.restore(
            path, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
        )["meta"]
    except (FileNotFoundError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not a boxwood orbax checkpoint (a directory with the items "
            f"`state` and `meta`): {e}"
        ) from None
    return tensors, meta


def _target(plan: Plan) -> jax.ShapeDtypeStruct:
    like, leaf = plan.leaf.value, plan.leaf
    if isinstance(like, (np.ndarray, np.generic)):
        return jax.ShapeDtypeStruct(leaf.shape, plan.dtype)  # restored as NumPy
    sharding = sharding_of(like)
    if leaf.key_impl is not None and not isinstance(
        sharding, jax.sharding.NamedSharding
    ):
        sharding = None  # key data has an extra axis: placed after restoring
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, plan.dtype, sharding=sharding)


def _restore(path: str, plans: list[Plan]) -> dict[str, Any]:
    ocp = orbax_checkpoint()
    targets = {plan.leaf.name: _target(plan) for plan in plans}
    restore_args = ocp.checkpoint_utils.construct_restore_args(targets)
    args = ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            targets, restore_args=restore_args, partial_restore=True
        )
    )
    checkpointer = ocp.Checkpointer(_handler(ocp))
    restored = checkpointer.restore(path, args=args)["state"]
    out = {}
    for plan in plans:
        value = restored[plan.leaf.name]
        like = plan.leaf.value
        if plan.leaf.key_impl is not None:
            value = jax.random.wrap_key_data(value, impl=plan.leaf.key_impl)
            if sharding_of(like) is not None and value.sharding != sharding_of(like):
                value = jax.device_put(value, sharding_of(like))
        elif isinstance(like, np.generic):
            value = np.asarray(value)[()]
        out[plan.leaf.name] = value
    return out


def load_orbax(path: Any, like: Any, *, strict: bool, dtype: Any) -> Any:
    """Load the orbax checkpoint directory `path` into `like`, validated first."""
    path = os.path.abspath(os.fspath(path))
    tensors, meta = item_metadata(path)
    like_leaves, _, _ = stored_leaves(like)
    check_keys(path, meta, tensors, like_leaves)
    tree, _ = assemble(
        like,
        tensors,
        strict=strict,
        cast=dtype,
        source=f"the checkpoint {path}",
        hint=fingerprint_hint(meta, like_leaves),
        materialise=lambda plans: _restore(path, plans),
    )
    return tree


def read_orbax_metadata(path: Any) -> dict:
    """The user metadata of the orbax checkpoint directory `path`."""
    _, meta = item_metadata(os.path.abspath(os.fspath(path)))
    try:
        return json.loads(meta.get(USER_KEY, "{}"))
    except json.JSONDecodeError:
        raise CheckpointError(
            f"{path}: its metadata is corrupted (not JSON)."
        ) from None
