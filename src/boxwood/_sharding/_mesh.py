"""`make_mesh`: a device mesh whose axes XLA's SPMD partitioner handles (Auto)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import AxisType


def make_mesh(
    axis_shapes: Sequence[int], axis_names: Sequence[str], *, devices: Any = None
) -> jax.sharding.Mesh:
    """`jax.make_mesh` with every axis of type `AxisType.Auto`.

    Recent JAX makes `Explicit` axes by default, where every operation must say how
    its result is sharded; boxwood's layers are written for `Auto` axes, where
    XLA's SPMD partitioner propagates the shardings of the inputs through the
    computation (and inserts the collectives).

    **Arguments:**

    - `axis_shapes`: the size of each axis; their product is the number of devices
        used.
    - `axis_names`: a name for each axis, e.g. `("data", "model")`.
    - `devices`: the devices to use (default: all of `jax.devices()`, across every
        process). (Keyword only.)

    **Returns:** a `jax.sharding.Mesh`.

    >>> import boxwood
    >>> mesh = boxwood.make_mesh((1,), ("data",))
    >>> dict(mesh.shape), mesh.axis_types
    ({'data': 1}, (Auto,))
    """
    types = (AxisType.Auto,) * len(axis_names)
    return jax.make_mesh(axis_shapes, axis_names, axis_types=types, devices=devices)
