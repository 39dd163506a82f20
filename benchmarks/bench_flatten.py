"""Figure 3, flatten/unflatten: `jax.tree_util.tree_flatten(model)` and
`treedef.unflatten(leaves)` for a 65-layer MLP (130 leaves).

The limit is a plain `@dataclass` registered with `jax.tree_util.register_dataclass`
(flattened by JAX's C++ code). Every `filter_jit` call flattens its arguments and
unflattens its outputs, so this cost is part of every call. Two rows show what the C
extensions buy: unflatten without the rebuild slot, and flatten with the Python twin
of the field descriptors (`boxwood._native._fields`).
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


def _without_rebuild_slot(run):
    """`run` with the C extension's rebuild slot (`install_call`, the metaclass's
    `tp_call`) switched off: what that slot buys on JAX's unflatten path."""
    from boxwood._module._module import use_rebuild_slot

    def slow(n: int) -> None:
        use_rebuild_slot(False)
        try:
            run(n)
        finally:
            use_rebuild_slot(True)

    return slow


PY_FIELDS = "boxwood, Python field descriptors"


def _with_python_fields(run, model):
    """`run` with the model's classes reading their fields through the Python twin
    of the C field descriptor (`_module._PyFieldBase`, what a build without the
    extension uses): what `boxwood._native._fields` buys on JAX's flatten path."""
    from boxwood._module import _instance as _module

    class Twin(_module._FieldRules, _module._PyFieldBase):
        __slots__ = ("default", "static")

    classes = {type(model), *(type(layer) for layer in model.layers)}
    swaps = [
        (
            cls,
            f.name,
            Twin(f.name, f.default, _module.is_static(f)),
            cls.__dict__[f.name],
        )
        for cls in classes
        for f in cls._boxwood_fields
    ]

    def slow(n: int) -> None:
        for cls, name, twin, _ in swaps:
            type.__setattr__(cls, name, twin)
        try:
            run(n)
        finally:
            for cls, name, _, own in swaps:
                type.__setattr__(cls, name, own)

    return slow


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
    from boxwood import _native
    from boxwood._module import _instance as _module

    with_slot = _native.install_call is not None
    with_c_fields = _module._Field.__mro__[2] is not _module._PyFieldBase
    case = f"{layers_for(LEAVES)}-layer MLP, {LEAVES} leaves"
    rows = []
    for op, make in (("flatten", _flattener), ("unflatten", _unflattener)):
        runners = {kind: make(model) for kind, model in models.items()}
        if with_slot and op == "unflatten":
            runners[NO_SLOT] = _without_rebuild_slot(runners["boxwood"])
        if with_c_fields and op == "flatten":
            runners[PY_FIELDS] = _with_python_fields(
                runners["boxwood"], models["boxwood"]
            )
        results = interleave(runners, reps=reps, target_s=target)
        rows += timing_rows(FIGURE, f"{op}: {case}", results, limit="dataclass")
    return rows
