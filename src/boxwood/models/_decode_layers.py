"""The layers of `generate`'s decoding loop, sliced from the stack once, before
the loop.

A one-token decoding step runs the layers one after the other with static
indices (`_blocks.run_blocks`). Sliced inside the loop's body, each layer's
weights are read through a slice of the stacked array on every step, and on a
TPU those products run well below the chip's bandwidth: GPT-2-small's step at
batch 1 took 0.425 ms so, against 0.290 ms with each layer's weights an array
of its own, sliced once before the loop
(`benchmarks/results/2026-12-06-tpu-v5e-generate-profile.md`). The slices are
copies: the layers' weights are held twice for the length of the call, so they
are made only on a TPU and only where the copy takes at most a quarter of the
device memory left; elsewhere the model is used as it is (on a CPU the
slicing inside the body is as fast). Only a loop over one row uses them
(`_generate_loop.prefill`): over a batch of rows (a `vmap` of the step) the
products read many rows per weight already, and with the layers apart XLA
copied the whole cache every step (3.96 ms a step at batch 32 against 1.33).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu

from .._tree import tree_at

# "auto" (a TPU, where the copy fits), "always" or "never"; tests set "always"
# to run the sliced loop on a CPU.
SLICE_LAYERS = "auto"
# the share of the device's free memory the copy may take
_SHARE = 4


def _free_bytes() -> int | None:
    """The first local device's memory not in use, `None` where it reports none."""
    stats = jax.local_devices()[0].memory_stats()
    if not stats or not stats.get("bytes_limit"):
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _nbytes(tree: Any) -> int:
    return sum(
        x.size * x.dtype.itemsize for x in jtu.tree_leaves(tree) if hasattr(x, "dtype")
    )


def _worth_slicing(stack: Any) -> bool:
    if SLICE_LAYERS != "auto":
        return SLICE_LAYERS == "always"
    if jax.default_backend() != "tpu":
        return False
    free = _free_bytes()
    return free is not None and _nbytes(stack) * _SHARE <= free


def with_layers_apart(model: Any) -> Any:
    """`model` (inside `generate`'s trace) with its stacked layers replaced by a
    tuple of the layers, each sliced from the stack once, where that is worth
    its copy (see the module docstring); else `model` itself. A model without
    stacked layers (no `blocks`) is returned as it is."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return model
    stack = blocks(model)
    if not _worth_slicing(stack):
        return model
    return tree_at(blocks, model, tuple(stack[i] for i in range(len(stack))))
