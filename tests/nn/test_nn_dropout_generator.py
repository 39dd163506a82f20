"""`boxwood.nn.dropout_generator`: dropout's masks from XLA's `RngBitGenerator`
(the TPU's own generator; it runs on a CPU too), forced here on the CPU: the
rates, independence across layers, positions, rows and steps, reproducibility,
and "auto" choosing threefry off a TPU (so CPU results are unchanged)."""

import re

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
import boxwood.nn as nn
from boxwood._init import (
    LAYER,
    PART,
    ROW,
    derived_key,
    keep_mask,
    resolved_generator,
    split_keys_of,
    stream_key,
)
from boxwood.models._training import layer_key, split

N = 65536  # entries per mask: a rate's standard error is below 0.002


def _masks(keys, q, shape):
    """The masks of a stack of keys, each drawn in its own jitted call."""
    draw = jax.jit(lambda k: keep_mask(k, q, shape))
    return np.stack([np.asarray(draw(k)) for k in keys])


def _both_dropped(a, b):
    """The fraction of entries dropped in both masks."""
    return float(np.mean(~a & ~b))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_rate_is_measured(p):
    x = jnp.full((N,), 2.0)
    with nn.dropout_generator("rbg"):
        y = np.asarray(jax.jit(lambda k: nn.Dropout(p)(x, key=k))(jr.key(0)))
    kept = y != 0
    np.testing.assert_allclose(y[kept], 2.0 / (1 - p), rtol=1e-6)
    assert abs(kept.mean() - (1 - p)) < 0.01  # 5 standard errors


def test_layers_steps_and_positions_are_independent():
    """Masks of the layer keys the models use (`fold_in(step_key, layer)`, the
    index traced in a scan) and of successive steps' keys: each pair drops an
    entry together with probability p**2, and neighbouring positions too."""
    p = 0.5
    steps = jr.split(jr.key(7), 2)

    def layers(step_key):
        def body(_, i):
            return None, keep_mask(jr.fold_in(step_key, i), 1 - p, (N,))

        return jax.lax.scan(body, None, jnp.arange(3))[1]

    with nn.dropout_generator("rbg"):
        masks = np.concatenate([np.asarray(jax.jit(layers)(k)) for k in steps])
    assert len({m.tobytes() for m in masks}) == 6
    for i in range(6):
        for j in range(i):
            assert abs(_both_dropped(masks[i], masks[j]) - p * p) < 0.01
    assert abs(_both_dropped(masks[0][1:], masks[0][:-1]) - p * p) < 0.01


def test_rows_under_vmap_are_independent():
    p = 0.5
    keys = jr.split(jr.key(3), 4)
    with nn.dropout_generator("rbg"):
        rows = np.asarray(jax.jit(jax.vmap(lambda k: keep_mask(k, 1 - p, (N,))))(keys))
    assert len({r.tobytes() for r in rows}) == 4
    assert abs(_both_dropped(rows[0], rows[3]) - p * p) < 0.01


def test_the_same_key_gives_the_same_mask():
    keys = [jr.key(1), jr.key(1), jr.key(2)]
    with nn.dropout_generator("rbg"):
        masks = _masks(keys, 0.7, (N,))
        eager = np.asarray(keep_mask(jr.key(1), 0.7, (N,)))
    np.testing.assert_array_equal(masks[0], masks[1])
    np.testing.assert_array_equal(masks[0], eager)
    assert (masks[0] != masks[2]).any()
    # the legacy uint32 key of the same seed draws the same mask
    with nn.dropout_generator("rbg"):
        legacy = np.asarray(keep_mask(jr.PRNGKey(1), 0.7, (N,)))
    np.testing.assert_array_equal(masks[0], legacy)


def test_rbg_differs_from_threefry_and_auto_is_threefry_off_a_tpu():
    key = jr.key(4)
    threefry = np.asarray(jr.bernoulli(key, 0.5, (256,)))
    auto = "rbg" if jax.default_backend() == "tpu" else "threefry"
    assert resolved_generator() == auto
    with nn.dropout_generator("threefry"):
        np.testing.assert_array_equal(keep_mask(key, 0.5, (256,)), threefry)
    with nn.dropout_generator("rbg"):
        assert (np.asarray(keep_mask(key, 0.5, (256,))) != threefry).any()
        with nn.dropout_generator("threefry"):  # nested blocks
            np.testing.assert_array_equal(keep_mask(key, 0.5, (256,)), threefry)
        assert resolved_generator() == "rbg"
    assert resolved_generator() == auto


def test_auto_is_rbg_on_a_tpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert resolved_generator() == "rbg"


def test_an_rbg_key_is_used_as_it_is():
    key = jr.key(5, impl="rbg")
    with nn.dropout_generator("rbg"):
        mask = np.asarray(keep_mask(key, 0.5, (64,)))
    bits = np.asarray(jr.bits(key, (64,), jnp.uint32))
    np.testing.assert_array_equal(mask, bits < 2**31)


def test_set_dropout_generator_sets_the_process_default():
    previous = nn.set_dropout_generator("rbg")
    try:
        assert previous == "auto"
        assert resolved_generator() == "rbg"
    finally:
        nn.set_dropout_generator(previous)
    assert resolved_generator() == (
        "rbg" if jax.default_backend() == "tpu" else "threefry"
    )


def test_an_unknown_name_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"'auto', 'threefry', 'rbg'.*got 'philox'"):
        with nn.dropout_generator("philox"):
            pass
    with pytest.raises(ValueError, match="got 'tpu'"):
        nn.set_dropout_generator("tpu")


def test_a_model_step_with_rbg_masks_is_reproducible_and_changes_with_the_key():
    """GPT-2's loss with its dropout (rates 0.1) drawn by the chip's generator:
    the same key gives the same loss and gradient, another key another loss,
    and the loss differs from the inference model's. The step is one compiled
    program (no key work outside it), whose only threefry hash is the one that
    turns the step's key into the generator's (each hash would be a loop of
    some 20 rounds, unrolled on a TPU, at every dropout forward and recomputed
    backward), and whose only `RngBitGenerator` draws are the masks': the
    layers', parts' and rows' keys are hashes of the key's words
    (`derived_key`), where JAX's `unsafe_rbg` `split` and `fold_in` drew
    five more words of keys in each block and four outside."""
    config = bm.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4
    )
    model = bm.GPT2LMHeadModel(config, key=jr.key(0))
    ids = jnp.asarray(np.arange(32, dtype=np.int32).reshape(2, 16) % 64)  # no eager ops
    grad = boxwood.filter_value_and_grad(bm.causal_lm_loss)
    keys = [jr.key(1), jr.key(1), jr.key(2)]
    compiles = []

    def listen(event, seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        with nn.dropout_generator("rbg"):
            step = boxwood.filter_jit(lambda m, k: grad(m, ids, key=k))
            (a, ga), (b, gb), (c, _) = (step(model, k) for k in keys)
            text = step.lower(model, keys[0]).as_text()  # (the call's trace)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(compiles) == 1
    assert len(re.findall(r"call @_?threefry", text)) == 1
    # the embeddings' mask; in the scanned block, the attention probabilities',
    # the attention output's and the MLP output's (nine draws before)
    assert text.count("rng_bit_generator") == 4
    # (jitted: run eagerly, each of the model's operations would compile alone)
    off = float(boxwood.filter_jit(bm.causal_lm_loss)(nn.inference_mode(model), ids))
    assert float(a) == float(b) and float(a) != float(c) and float(a) != off
    leaves = zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True)
    assert all(np.array_equal(x, y) for x, y in leaves)


def test_model_keys_drawn_by_rbg_give_independent_masks():
    """The keys as the models derive them with `rbg` (`stream_key` once, a key
    per row split from it, `fold_in` of the layer inside the scan over the
    layers, `split` into the block's parts, rows under `vmap`): every pair of
    masks (rows, layers, parts) drops an entry together with probability p**2,
    and the same step key draws the same masks."""
    p = 0.5

    def masks(step_key):
        rows = split_keys_of(stream_key(step_key), 2, ROW)

        def row(key):
            def body(_, i):
                parts = split(layer_key(key, i), 2)
                return None, jnp.stack([keep_mask(k, 1 - p, (N,)) for k in parts])

            return jax.lax.scan(body, None, jnp.arange(2))[1]

        return jax.vmap(row)(rows).reshape(-1, N)  # rows x layers x parts

    with nn.dropout_generator("rbg"):
        draw = jax.jit(masks)
        first, again = np.asarray(draw(jr.key(0))), np.asarray(draw(jr.key(0)))
        other = np.asarray(draw(jr.key(1)))
    np.testing.assert_array_equal(first, again)
    every = np.concatenate([first, other])
    assert len({m.tobytes() for m in every}) == 16
    for i in range(16):
        for j in range(i):
            assert abs(_both_dropped(every[i], every[j]) - p * p) < 0.01


def test_stream_key_with_threefry_is_the_key_and_with_rbg_draws_from_it():
    key = jr.key(3)
    with nn.dropout_generator("threefry"):
        assert stream_key(key) is key
        np.testing.assert_array_equal(  # the models' keys as before
            jr.key_data(jnp.stack(split(key, 2))), jr.key_data(jr.split(key, 2))
        )
    with nn.dropout_generator("rbg"):
        converted = stream_key(key)
        assert str(jr.key_impl(converted)) == "unsafe_rbg"
        assert stream_key(converted) is converted
        np.testing.assert_array_equal(
            jr.key_data(converted), jr.bits(key, (4,), jnp.uint32)
        )
        legacy = stream_key(jr.PRNGKey(3))
        np.testing.assert_array_equal(jr.key_data(legacy), jr.key_data(converted))
        rbg = jr.key(3, impl="rbg")  # its words are kept
        np.testing.assert_array_equal(jr.key_data(stream_key(rbg)), jr.key_data(rbg))
        assert stream_key(None) is None


def test_derived_keys_differ_along_every_path():
    """The models' keys with rbg masks are hashes of the stream key's words
    (`derived_key`): a number's key differs by purpose (layer, part, row), by
    number, and from the key it came from, and deriving again with the same
    number does not return to an earlier key (as XOR with a tweak alone would:
    a part of a part would be the layer's own key). Traced numbers (a layer's
    index in the scan) give the keys that concrete ones give."""
    with nn.dropout_generator("rbg"):
        root = stream_key(jr.key(5))
        layer = derived_key(root, 1, LAYER)
        keys = {
            "root": root,
            "layer 0": derived_key(root, 0, LAYER),
            "layer 1": layer,
            "part 1": derived_key(root, 1, PART),
            "row 1": derived_key(root, 1, ROW),
            "layer 1, part 0": split(layer, 2)[0],
            "layer 1, part 1": split(layer, 2)[1],
            "layer 1, part 0, part 0": split(split(layer, 2)[0], 2)[0],
            "layer 1, layer 1": derived_key(layer, 1, LAYER),
        }
        words = {name: jr.key_data(k).tobytes() for name, k in keys.items()}
        assert len(set(words.values())) == len(words)
        traced = jax.jit(lambda i: jr.key_data(derived_key(root, i, LAYER)))(1)
        np.testing.assert_array_equal(traced, jr.key_data(layer))
        rows = split_keys_of(root, 3, ROW)
        np.testing.assert_array_equal(jr.key_data(rows[1]), jr.key_data(keys["row 1"]))
    assert str(jr.key_impl(layer)) == "unsafe_rbg"
    with nn.dropout_generator("threefry"):  # threefry keys: JAX's own rules
        np.testing.assert_array_equal(
            jr.key_data(split_keys_of(jr.key(5), 2, ROW)),
            jr.key_data(jr.split(jr.key(5), 2)),
        )
