"""Figure 3, flatten/unflatten: `jax.tree_util.tree_flatten(model)` and
`treedef.unflatten(leaves)` for a 65-layer MLP (130 leaves).

The limit is a plain `@dataclass` registered with `jax.tree_util.register_dataclass`
(flattened by JAX's C++ code). Every `filter_jit` call flattens its arguments and
unflattens its outputs, so this cost is part of every call.
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


NO_SLOT = "boxwood, no C rebuild slot"


def _without_rebuild_slot(weights):
    """The boxwood model, its classes made without the C extension's `tp_init`
    rebuild slot (`install_init`): what that slot buys on JAX's unflatten path."""
    from _models import BwLinear, BwMLP
    from boxwood._jit import _native

    saved = _native.install_init
    _native.install_init = None
    try:

        class PyLinear(BwLinear):
            pass

        class PyMLP(BwMLP):
            pass

    finally:
        _native.install_init = saved
    model = build("boxwood", weights)
    return PyMLP(tuple(PyLinear(layer.weight, layer.bias) for layer in model.layers))


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
    from boxwood._jit import _native

    if _native.install_init is not None:
        models[NO_SLOT] = _without_rebuild_slot(weights)
        _check_roundtrip("boxwood", models[NO_SLOT])
    case = f"{layers_for(LEAVES)}-layer MLP, {LEAVES} leaves"
    rows = []
    for op, make in (("flatten", _flattener), ("unflatten", _unflattener)):
        runners = {kind: make(model) for kind, model in models.items()}
        results = interleave(runners, reps=reps, target_s=target)
        rows += timing_rows(FIGURE, f"{op}: {case}", results, limit="dataclass")
    return rows
