"""Figure 3, flatten/unflatten: `jax.tree_util.tree_flatten(model)` and
`treedef.unflatten(leaves)` for a 65-layer MLP (130 leaves).

The limit is a plain `@dataclass` registered with `jax.tree_util.register_dataclass`
(flattened by JAX's C++ code). A `filter_jit` call that cannot use flat forms
flattens its arguments and unflattens its outputs, so this cost is part of it.
"""

from __future__ import annotations

import jax

from _models import build, count_leaves, layers_for, make_weights
from _timing import interleave, timing_rows

FIGURE = "flatten/unflatten"
LEAVES = 130
CONTENDERS = ("dataclass", "boxwood", "equinox")


def _flattener(model):
    flatten = jax.tree_util.tree_flatten

    def run(n: int) -> None:
        for _ in range(n):
            flatten(model)

    return run


def _unflattener(model):
    leaves, treedef = jax.tree_util.tree_flatten(model)
    unflatten = treedef.unflatten

    def run(n: int) -> None:
        for _ in range(n):
            unflatten(leaves)

    return run


def _check_roundtrip(kind: str, model) -> None:
    leaves, treedef = jax.tree_util.tree_flatten(model)
    again = treedef.unflatten(leaves)
    assert type(again) is type(model), kind
    assert jax.tree_util.tree_leaves(again) == leaves, kind
    assert count_leaves(kind, model) == LEAVES, kind


def run(quick: bool) -> list[dict]:
    reps = 3 if quick else 15
    target = 0.02 if quick else 0.05
    weights = make_weights(layers_for(LEAVES))
    models = {kind: build(kind, weights) for kind in CONTENDERS}
    for kind, model in models.items():
        _check_roundtrip(kind, model)
    case = f"{layers_for(LEAVES)}-layer MLP, {LEAVES} leaves"
    rows = []
    for op, make in (("flatten", _flattener), ("unflatten", _unflattener)):
        runners = {kind: make(model) for kind, model in models.items()}
        results = interleave(runners, reps=reps, target_s=target)
        rows += timing_rows(FIGURE, f"{op}: {case}", results, limit="dataclass")
    return rows
