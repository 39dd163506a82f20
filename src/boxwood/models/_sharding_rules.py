"""Sharding rule sets shipped for each model class: data parallel, FSDP and
Megatron-style tensor parallel, as `(pattern, PartitionSpec)` rules."""

from __future__ import annotations

from typing import Any, Literal

from jax.sharding import PartitionSpec

from .._sharding import data_parallel, fsdp
from ._stacking import STACKED_FIELD, PerLayer

Strategy = Literal["data_parallel", "fsdp", "tensor_parallel"]

# Per class, the tensor-parallel layout of each kind of parameter: `column`
# splits a Linear's outputs (weight rows and bias), `row` its inputs (weight
# columns; bias replicated), `conv1d_*` the same for GPT-2's `(in, out)` weights, `embed` a table's embedding channels. Each
# column-parallel layer feeds a row-parallel one, so a block needs one reduction
# after attention and one after the MLP. Unlisted parameters (norms, position
# tables) are replicated.
_LAYER = r"(?:.*\.)?"
# Where a pattern names the layer's index: a model whose layers are a
# `boxwood.nn.Stacked` has `STACKED_FIELD` in that place of its leaves' paths.
_INDEX = r"\.\d+\."
_STACKED = rf"\.{STACKED_FIELD}\."
_BERT = [
    (
        r"encoder\.layer\.\d+\.(attention\.attn\.(query|key|value)_proj|intermediate)",
        "column",
    ),
    (r"encoder\.layer\.\d+\.(attention\.attn\.output_proj|output)", "row"),
    (r"embeddings\.word_embeddings", "embed"),
]
_TENSOR_PARALLEL = {
    "GPT2LMHeadModel": [
        (r"transformer\.h\.\d+\.(attn\.c_attn|mlp\.c_fc)", "conv1d_column"),
        (r"transformer\.h\.\d+\.(attn|mlp)\.c_proj", "conv1d_row"),
        (r"transformer\.wte", "embed"),
    ],
    "LlamaForCausalLM": [
        (r"model\.layers\.\d+\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)", "column"),
        (r"model\.layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj)", "row"),
        (r"model\.embed_tokens", "embed"),
        (r"lm_head", "row"),
    ],
    # (the heads' `bert.` prefix is matched by the rules' leading `_LAYER`)
    "BertModel": _BERT,
    "BertHead": _BERT,
    "ViTForImageClassification": [
        (
            r"vit\.encoder\.layer\.\d+\.(attention\.(query|key|value)_proj|intermediate)",
            "column",
        ),
        (r"vit\.encoder\.layer\.\d+\.(attention\.output_proj|output)", "row"),
    ],
}


def _specs(kind: str, axis: str) -> list[tuple[str, PartitionSpec]]:
    # GPT-2's Conv1D stores its weight `(in, out)`: the same split, other axis.
    if kind == "conv1d_column":
        return [("weight", PartitionSpec(None, axis)), ("bias", PartitionSpec(axis))]
    if kind == "conv1d_row":
        return [("weight", PartitionSpec(axis, None)), ("bias", PartitionSpec())]
    if kind == "column":
        return [("weight", PartitionSpec(axis, None)), ("bias", PartitionSpec(axis))]
    if kind == "row":
        return [("weight", PartitionSpec(None, axis)), ("bias", PartitionSpec())]
    return [("weight", PartitionSpec(None, axis))]


def sharding_rules(
    model: Any,
    strategy: Strategy = "tensor_parallel",
    *,
    data_axis: str = "data",
    model_axis: str = "model",
) -> list:
    """The sharding rules boxwood ships for a model class.

    - `"data_parallel"`: every parameter replicated; split the batch with
      [`boxwood.shard_batch`][].
    - `"fsdp"`: each parameter's largest dimension divisible by the `data_axis`
      size split over it ([`boxwood.fsdp`][]).
    - `"tensor_parallel"`: attention heads and MLP channels split over
      `model_axis` (query/key/value and the MLP's first layer column-parallel,
      attention output and the MLP's last layer row-parallel, token embeddings
      split on their channels); everything else replicated. Combine with a
      `data_axis` for the batch on a 2-D mesh.

    The patterns also match the same names deeper in a tree, so the rules shard
    an optimiser state that mirrors the model.

    The rules name a layer's parameters per layer, as the checkpoint does
    (`model.layers.3.mlp.up_proj.weight`). Where a model holds its layers as a
    `boxwood.nn.Stacked` (one layer whose arrays have a leading layer axis, at
    `model.layers.layers.mlp.up_proj.weight`), each such rule has a twin for the
    stacked path that splits every layer as the rule splits one and keeps the
    layer axis whole; `from_pretrained(..., rules=)` treats any rules so.

    **Arguments:**

    - `model`: a model of `boxwood.models`, or its class.
    - `strategy`: one of the three above.
    - `data_axis`, `model_axis`: the mesh axis names. (Keyword only.)

    **Returns:** a list of `(pattern, PartitionSpec)` for [`boxwood.shard`][] and
    `from_pretrained(..., mesh=, rules=)`.
    """
    if strategy == "data_parallel":
        return data_parallel()
    if strategy not in ("fsdp", "tensor_parallel"):
        raise ValueError(
            f"`strategy` must be 'data_parallel', 'fsdp' or 'tensor_parallel', got {strategy!r}."
        )
    layout = _layout(model, strategy)
    if strategy == "fsdp":
        return _fsdp_rules(layout or [], data_axis)
    rules = []
    for pattern, kind in layout or []:
        for leaf, spec in _specs(kind, model_axis):
            rules.append((rf"{_LAYER}{pattern}\.{leaf}", spec))
            if _INDEX in pattern:
                stacked = pattern.replace(_INDEX, _STACKED)
                rules.append(
                    (rf"{_LAYER}{stacked}\.{leaf}", PartitionSpec(None, *spec))
                )
    return rules + [(".*", PartitionSpec())]


def _layout(model: Any, strategy: str) -> list[tuple[str, str]] | None:
    """The tensor-parallel layout of `model`'s class (a subclass, Mistral or Qwen2
    of Llama, shares its base's); `None` for FSDP of a class without one."""
    cls = model if isinstance(model, type) else type(model)
    layout = next(
        (
            _TENSOR_PARALLEL[c.__name__]
            for c in cls.__mro__
            if c.__name__ in _TENSOR_PARALLEL
        ),
        None,
    )
    if layout is None and strategy == "tensor_parallel":
        raise TypeError(
            f"`sharding_rules` takes a model of `boxwood.models` (or its class), got "
            f"{cls.__name__}; for other models use `boxwood.tensor_parallel(model)`."
        )
    return layout


def _fsdp_rules(layout: list[tuple[str, str]], axis: str) -> list:
    """FSDP's rules, with the layers of a stacked model split as one layer is
    (the leading layer axis kept whole)."""
    plain = fsdp(axis)
    stacks = sorted({p.split(_INDEX)[0] for p, _ in layout if _INDEX in p})
    stacked = [
        (rf"{_LAYER}{prefix}{_STACKED}.*", PerLayer(spec))
        for prefix in stacks
        for _, spec in plain
    ]
    return stacked + plain
