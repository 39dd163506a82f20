"""The decoder blocks of `boxwood.models` are stored stacked and applied in one
`lax.scan`: equal to applying them one by one, compiled code flat in depth,
layers indexable, one stacked key/value cache, and per-block rematerialisation."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn
from _jaxprs import all_equations, primitive_names
from _tiny_causal_lms import gpt2 as _gpt2
from _tiny_causal_lms import llama as _llama
from _tiny_causal_lms import qwen2_mixed as _qwen2_mixed
from boxwood.models._attend import Step
from boxwood.models._blocks import layer_windows

IDS = jnp.asarray(np.random.RandomState(1).randint(3, 97, size=9), jnp.int32)


def _unrolled_llama(model, ids):
    body = model.model
    x = body.embed_tokens.weight[ids]
    for i, layer in enumerate(body.layers):
        window = body.windows[i]
        x, _ = layer(x, Step(0), None, jnp.int32(i), window)
    return jax.vmap(body.norm)(x) @ model.output_embedding().T


def _unrolled_gpt2(model, ids):
    body = model.transformer
    x = body.wte.weight[ids] + body.wpe.weight[jnp.arange(ids.shape[0])]
    for i, block in enumerate(body.h):
        x, _ = block(x, Step(0), None, jnp.int32(i))
    return jax.vmap(body.ln_f)(x) @ model.output_embedding().T


@pytest.mark.parametrize(
    "make, unrolled",
    [
        (_gpt2, _unrolled_gpt2),
        (_llama, _unrolled_llama),
        (_qwen2_mixed, _unrolled_llama),
    ],
)
def test_scanned_equals_unrolled(make, unrolled):
    # one compiled program for both (eagerly, each scan compiles on every call)
    scanned, by_hand = boxwood.filter_jit(lambda m: (m(IDS), unrolled(m, IDS)))(make())
    np.testing.assert_allclose(scanned, by_hand, rtol=1e-5, atol=1e-5)


def test_qwen2_mixed_windows_are_data_of_the_scan():
    model = _qwen2_mixed()
    assert model.model.windows == (None, 3, 3)
    shared, per_layer = layer_windows(model.model.windows)
    assert shared is None and per_layer.dtype == jnp.int32
    assert per_layer[0] >= model.config.max_position_embeddings
    assert per_layer.tolist()[1:] == [3, 3]
    assert layer_windows((5, 5)) == (5, None)


def test_layers_are_stacked_and_indexable():
    model = _llama(3)
    layers = model.model.layers
    assert isinstance(layers, nn.Stacked) and len(layers) == 3
    assert layers.layers.self_attn.k_proj.weight.shape == (3, 16, 32)
    assert layers[0].self_attn.k_proj.weight.shape == (16, 32)
    np.testing.assert_array_equal(
        layers[-1].mlp.up_proj.weight, layers.layers.mlp.up_proj.weight[2]
    )
    assert [layer.self_attn.num_heads for layer in layers] == [4, 4, 4]
    with pytest.raises(IndexError, match="layer 3 is out of range for a stack of 3"):
        layers[3]
    with pytest.raises(TypeError, match="a layer index must be an int"):
        layers["0"]  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_program_size_is_flat_in_depth(make):
    forward = lambda model, ids: model(ids)
    cached = lambda model, ids: model.decode(ids, model.init_cache(16), 0)[0]
    for fn in (forward, cached):
        sizes = [
            sum(1 for _ in all_equations(jax.make_jaxpr(fn)(make(depth), IDS).jaxpr))
            for depth in (2, 8)
        ]
        assert sizes[0] == sizes[1]


def test_cache_is_one_stacked_entry():
    model = _llama(3)
    state = model.init_cache(16)
    leaves = jax.tree_util.tree_leaves(state)
    assert [x.shape for x in leaves] == [(3, 16, 2, 8), (3, 16, 2, 8)]

    @boxwood.filter_jit
    def run(model, state):
        logits, state = model.decode(IDS[:4], state, 0)
        return logits, state.get(model.model.cache)[0], model(IDS[:4])

    logits, keys, full = run(model, state)
    assert bool(jnp.any(keys[2, :4] != 0)) and not bool(jnp.any(keys[:, 4:] != 0))
    np.testing.assert_allclose(logits, full, rtol=1e-5, atol=1e-5)


def _is_remat(name):
    return "remat" in name or "checkpoint" in name


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_remat_puts_a_checkpoint_in_the_gradient(make):
    loss = lambda model, ids: jnp.sum(model(ids) ** 2)
    grad = boxwood.filter_grad(loss)
    model = make()
    assert model.with_remat(None) is not model
    for remat, expected in [(None, False), ("full", True), ("dots_saveable", True)]:
        with_remat = model.with_remat(remat)
        names = primitive_names(jax.make_jaxpr(grad)(with_remat, IDS).jaxpr)
        assert any(_is_remat(n) for n in names) == expected, remat
    if make is _llama:
        return  # the numbers: once (the remat wrapper is `Stacked`'s, shared)
    # both gradients from one compiled program
    both = boxwood.filter_jit(lambda a, b, ids: (grad(a, ids), grad(b, ids)))
    full, plain = both(model.with_remat("full"), model, IDS)
    for a, b in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(plain)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bad_remat():
    with pytest.raises(ValueError, match=r"`remat` must be .*got 'some_policy'"):
        _llama().with_remat("some_policy")
