import jax
import jax.numpy as jnp
import pytest

import boxwood
import boxwood.nn as nn


class Block(boxwood.Module):
    """A user module with its own `__init__` (which must not be re-run)."""

    linear: nn.Linear
    dropout: nn.Dropout
    scale: float = boxwood.field(static=True)

    def __init__(self, size, *, key):
        self.linear = nn.Linear(size, size, key=key)
        self.dropout = nn.Dropout(0.3)
        self.scale = 2.0
        CALLS.append(size)

    def __call__(self, x, *, key=None):
        return self.dropout(self.linear(x), key=key) * self.scale


class Flagged(boxwood.Module):
    """A user module with its own `inference` field."""

    weight: jax.Array
    inference: bool = boxwood.field(static=True, default=False)


CALLS: list = []


def _model(getkey):
    return {
        "blocks": [Block(3, key=getkey()), nn.Dropout(0.1)],
        "pair": (nn.Dropout(0.2), nn.LayerNorm(3)),
        "flagged": Flagged(jnp.ones(2)),
        "mlp": nn.MLP(3, 3, 4, 1, key=getkey()),
        "lr": 0.1,
        "misc": [None, nn.Linear(3, 2, use_bias=False, key=getkey()), nn.Identity()],
    }


def _flags(tree):
    is_flagged = lambda x: isinstance(x, (nn.Dropout, Flagged))
    nodes = jax.tree_util.tree_leaves(tree, is_leaf=is_flagged)
    return [n.inference for n in nodes if is_flagged(n)]


def test_flips_every_flag_and_nothing_else(getkey):
    model = _model(getkey)
    assert _flags(model) == [False] * 4
    CALLS.clear()
    inf = nn.inference_mode(model)
    assert CALLS == []  # no `__init__` re-run
    assert _flags(inf) == [True] * 4
    assert _flags(model) == [False] * 4  # the original is untouched
    assert type(inf) is dict and type(inf["blocks"]) is list
    assert type(inf["blocks"][0]) is Block and inf["blocks"][0].scale == 2.0
    leaves, treedef = jax.tree_util.tree_flatten(model)
    inf_leaves, inf_treedef = jax.tree_util.tree_flatten(inf)
    assert treedef != inf_treedef
    assert len(leaves) == len(inf_leaves)
    assert all(a is b for a, b in zip(leaves, inf_leaves))
    # Flipping back gives back exactly the original structure.
    back = nn.inference_mode(inf, value=False)
    assert jax.tree_util.tree_structure(back) == treedef
    assert boxwood.tree_equal(back, model)


def test_already_in_mode_is_unchanged(getkey):
    model = _model(getkey)
    inf = nn.inference_mode(model)
    again = nn.inference_mode(inf)
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(inf)
    assert again["lr"] == 0.1
    assert all(
        a is b
        for a, b in zip(
            jax.tree_util.tree_leaves(inf), jax.tree_util.tree_leaves(again)
        )
    )


def test_top_level_module_and_behaviour(getkey):
    block = Block(3, key=getkey())
    x = jnp.ones(3)
    with pytest.raises(RuntimeError, match="needs a random key"):
        block(x)
    inf = nn.inference_mode(block)
    assert type(inf) is Block
    assert jnp.allclose(inf(x), block.linear(x) * 2.0)


def test_jit_compiles_once_per_mode(getkey):
    block = Block(3, key=getkey())
    traces = []

    @jax.jit
    def run(m, x, key):
        traces.append(None)
        return m(x, key=key)

    x, key = jnp.ones(3), getkey()
    inf = nn.inference_mode(block)
    run(inf, x, key)
    run(nn.inference_mode(nn.inference_mode(inf, False)), x, key)
    assert len(traces) == 1
    run(block, x, key)
    assert len(traces) == 2


def test_value_must_be_bool(getkey):
    with pytest.raises(TypeError, match="`value` must be a Python bool"):
        nn.inference_mode(nn.Dropout(), value=1)


def test_filter_jit_once_per_mode(getkey):
    model = [Block(3, key=getkey()), nn.Dropout(0.5)]
    traces = []

    @boxwood.filter_jit
    def run(m, x, key):
        traces.append(None)
        k1, k2 = jax.random.split(key)
        return m[1](m[0](x, key=k1), key=k2)

    x, key = jnp.ones(3), getkey()
    run(model, x, key)
    inf = nn.inference_mode(model)
    out = run(inf, x, key)
    assert len(traces) == 2
    run(nn.inference_mode(inf, False), x, key)
    run(nn.inference_mode(model), x, key)
    assert len(traces) == 2
    assert jnp.allclose(out, model[0].linear(x) * 2.0)


def test_inference_mode_flips_dropout_and_batch_norm_in_a_nested_model():
    key = jax.random.key(0)
    model, _ = nn.make_with_state(nn.Sequential)(
        [
            nn.Linear(3, 4, key=key),
            nn.BatchNorm(4, axis_name="batch"),
            nn.Dropout(0.3),
            nn.Lambda(jax.nn.relu),
        ]
    )
    flipped = nn.inference_mode(model)
    flags = [getattr(layer, "inference", None) for layer in flipped.layers]
    assert flags == [None, True, True, None]
    assert [getattr(layer, "inference", None) for layer in model.layers] == [
        None,
        False,
        False,
        None,
    ]
    # nothing else changed: same leaves, and only the two flags differ in structure
    assert all(
        a is b
        for a, b in zip(
            jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(flipped)
        )
    )
    back = nn.inference_mode(flipped, False)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(model)


def test_equinox_parameter_names():
    # `inference_mode(pytree, value=True)`, as in Equinox.
    model = {"a": nn.Dropout(0.1), "b": [nn.Dropout(0.2)]}
    flipped = nn.inference_mode(pytree=model, value=True)
    assert flipped["a"].inference and flipped["b"][0].inference
    back = nn.inference_mode(pytree=flipped, value=False)
    assert not back["a"].inference and not back["b"][0].inference
