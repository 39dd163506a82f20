"""Writing the trained modules and reading them back."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import numpy as np

from .._paths import leaves_with_dotted_paths
from ._cli import DemoError


def save_models(path: pathlib.Path, models: dict, metadata: dict) -> pathlib.Path:
    """Write the arrays of `models` to a safetensors file at `path`."""
    try:
        from safetensors.numpy import save_file
    except ModuleNotFoundError:
        raise DemoError("the demo's checkpoint needs safetensors; install the train extra: pip install 'boxwood[train]'") from None
    tensors = {name: np.asarray(x) for name, x in leaves_with_dotted_paths(models)}
    save_file(tensors, str(path), metadata={"boxwood-demo": json.dumps(metadata)})
    return path


def load_models(path: pathlib.Path, like: Any) -> Any:
    """Read a checkpoint written by `save_models` into the structure of `like`."""
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    flat, treedef = jax.tree_util.tree_flatten(like)
    names = [name for name, _ in leaves_with_dotted_paths(like)]
    return jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(tensors[n]) for n in names])
