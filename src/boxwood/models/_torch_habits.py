"""The methods of a PyTorch `transformers` model that a boxwood model does not
have, each with boxwood's way: `Pretrained.__getattr__` (which runs only when
normal attribute lookup misses, so the fields are read at full speed) raises an
`AttributeError` with it."""

from __future__ import annotations

_INFERENCE = (
    "boxwood models are immutable pytrees with no mode to switch in place: "
    "`model = boxwood.nn.inference_mode(model{value})` returns a copy {what}. The "
    "mode is a static field, so each mode compiles once."
)
_LEAVES = (
    "a boxwood model is a pytree: its parameters are "
    "`jax.tree.leaves(boxwood.filter(model, boxwood.is_inexact_array))`"
)
_NAMED = (
    "a boxwood model is a pytree: `boxwood.state_dict(model)` maps each "
    "parameter's checkpoint name to its array (`jax.tree_util."
    "tree_leaves_with_path(model)` gives the tree paths)"
)
_GRADIENTS = (
    "gradients are not stored on a boxwood model: `boxwood.filter_value_and_grad"
    "(loss)(model, ...)` returns them, for the inexact arrays (freeze a part by "
    "filtering it out, see `boxwood.partition`)"
)
_DEVICE = (
    "place a boxwood model with `jax.device_put(model, device)`, or shard it with "
    "`boxwood.shard(model, mesh, boxwood.models.sharding_rules(model))`"
)
_DTYPE = (
    "`boxwood.cast_floating(model, jnp.bfloat16)` returns a copy in another dtype "
    "(or load it in one: `from_pretrained(path, dtype=jnp.bfloat16)`)"
)

#: `method name -> boxwood's way`, for the PyTorch (`torch.nn.Module`,
#: `transformers.PreTrainedModel`) methods a model is most often asked for.
HABITS = {
    "eval": _INFERENCE.format(value="", what="with dropout off (`eval()`)"),
    "train": _INFERENCE.format(value=", False", what="with dropout on (`train()`)"),
    "parameters": _LEAVES,
    "named_parameters": _NAMED,
    "buffers": _LEAVES,
    "named_buffers": _NAMED,
    "load_state_dict": (
        "`model = boxwood.load_state_dict(model, state_dict)` returns a new model "
        "(or `from_pretrained(path)` reads a directory)"
    ),
    "zero_grad": _GRADIENTS,
    "requires_grad_": _GRADIENTS,
    "to": _DEVICE + "; " + _DTYPE,
    "cuda": _DEVICE,
    "cpu": _DEVICE,
    "half": _DTYPE,
    "bfloat16": _DTYPE,
    "float": _DTYPE,
    "forward": "call the model itself: `model(input_ids)`",
    "generate": (
        "`boxwood.models.generate(model, input_ids, max_new_tokens)` (a function, "
        "not a method)"
    ),
    "num_parameters": "`boxwood.summary(model)` counts the parameters",
    "gradient_checkpointing_enable": (
        "`model = model.with_remat(True)` returns a copy whose layers are "
        "recomputed on the backward pass"
    ),
}


def habit_error(model: object, name: str) -> AttributeError:
    """The `AttributeError` of `model.name`, with boxwood's way where `name` is a
    PyTorch habit."""
    cls = type(model).__name__
    message = f"{cls!r} object has no attribute {name!r}"
    if name in HABITS:
        message += f" (it is a PyTorch method): {HABITS[name].rstrip('.')}."
    return AttributeError(message)
