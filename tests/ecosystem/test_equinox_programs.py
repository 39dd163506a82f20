"""End-to-end programs written as Equinox users write them (after Equinox's
documented examples: a CNN on MNIST-like data, RNN training, frozen layers,
stateful BatchNorm, ensembling with `filter_vmap`, a small vision transformer).

Each program takes the library as its `eqx` argument and runs unchanged with
`import equinox as eqx` and with `import boxwood as eqx`; the test runs it with both
and checks that the losses agree step by step (both libraries draw the same
initial weights for these layers from the same key). Sizes are tiny: this checks
the API and semantics, not learning.
"""

import importlib

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

optax = pytest.importorskip("optax")
pytest.importorskip("equinox")


def both(program, *args):
    """`program(eqx, *args)` for Equinox and for boxwood; their results agree.

    (Run with JAX's standard dtype promotion, as users run them: optax mixes its
    integer step count with floats, which the suite's strict setting rejects.
    boxwood draws its dropout masks with threefry here, as Equinox does: on a
    TPU its default is the chip's own generator, whose masks differ.)
    """
    boxwood = importlib.import_module("boxwood")
    with jax.numpy_dtype_promotion("standard"):
        theirs = program(importlib.import_module("equinox"), *args)
        with boxwood.nn.dropout_generator("threefry"):
            ours = program(boxwood, *args)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=1e-5)
    return ours


def cnn_program(eqx):
    """The MNIST CNN example: conv, pool, MLP head, AdamW, `filter_jit` step."""

    class CNN(eqx.Module):
        layers: list

        def __init__(self, key):
            key1, key2, key3, key4 = jr.split(key, 4)
            self.layers = [
                eqx.nn.Conv2d(1, 3, kernel_size=4, key=key1),
                eqx.nn.MaxPool2d(kernel_size=2),
                jax.nn.relu,
                jnp.ravel,
                eqx.nn.Linear(3 * 6 * 6, 16, key=key2),
                jax.nn.sigmoid,
                eqx.nn.Linear(16, 10, key=key3),
                jax.nn.log_softmax,
            ]
            del key4

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        return -jnp.mean(jnp.take_along_axis(pred_y, y[:, None], axis=1))

    model = CNN(jr.PRNGKey(0))
    optim = optax.adamw(3e-3)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def make_step(model, opt_state, x, y):
        loss_value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        updates, opt_state = optim.update(
            grads, opt_state, eqx.filter(model, eqx.is_array)
        )
        model = eqx.apply_updates(model, updates)
        return model, opt_state, loss_value

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(8, 1, 10, 10)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, size=(8,)))
    losses = []
    for _ in range(4):
        model, opt_state, loss_value = make_step(model, opt_state, x, y)
        losses.append(loss_value)
    assert losses[-1] < losses[0]
    return jnp.stack(losses)


def rnn_program(eqx):
    """The RNN example (a GRU cell scanned over the sequence), with the first
    layer frozen through a filter spec built with `tree_at`."""

    class RNN(eqx.Module):
        hidden_size: int = eqx.field(static=True)
        cell: eqx.Module
        linear: eqx.nn.Linear
        bias: jax.Array

        def __init__(self, in_size, out_size, hidden_size, *, key):
            ckey, lkey = jr.split(key)
            self.hidden_size = hidden_size
            self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
            self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
            self.bias = jnp.zeros(out_size)

        def __call__(self, input):
            hidden = jnp.zeros((self.hidden_size,))

            def f(carry, inp):
                return self.cell(inp, carry), None

            out, _ = jax.lax.scan(f, hidden, input)
            return jax.nn.sigmoid(self.linear(out) + self.bias)

    model = RNN(in_size=2, out_size=1, hidden_size=8, key=jr.PRNGKey(1))
    filter_spec = jax.tree_util.tree_map(lambda _: True, model)
    filter_spec = eqx.tree_at(
        lambda tree: (tree.cell.weight_ih, tree.cell.weight_hh),
        filter_spec,
        replace=(False, False),
    )

    @eqx.filter_jit
    def make_step(model, x, y, opt_state):
        @eqx.filter_grad
        def loss(diff_model, static_model, x, y):
            model = eqx.combine(diff_model, static_model)
            pred_y = jax.vmap(model)(x)[:, 0]
            return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

        diff_model, static_model = eqx.partition(model, filter_spec)
        grads = loss(diff_model, static_model, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return model, opt_state

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(6, 5, 2)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 2, size=(6,)), jnp.float32)
    optim = optax.adam(1e-2)
    opt_state = optim.init(eqx.filter(model, filter_spec))
    start = model
    for _ in range(3):
        model, opt_state = make_step(model, x, y, opt_state)
    # The frozen weights did not move; the others did.
    np.testing.assert_array_equal(model.cell.weight_ih, start.cell.weight_ih)
    np.testing.assert_array_equal(model.cell.weight_hh, start.cell.weight_hh)
    assert not np.array_equal(model.cell.bias, start.cell.bias)
    return jnp.concatenate([model.linear.weight.ravel(), model.cell.bias])


def stateful_program(eqx):
    """The stateful example: BatchNorm inside a Sequential with `make_with_state`,
    then inference mode; and an ensemble of MLPs built and run with `filter_vmap`."""

    model, state = eqx.nn.make_with_state(eqx.nn.Sequential)(
        [
            eqx.nn.Linear(3, 8, key=jr.PRNGKey(2)),
            eqx.nn.BatchNorm(8, axis_name="batch", mode="batch"),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Linear(8, 1, key=jr.PRNGKey(3)),
        ]
    )

    def compute_loss(model, state, x, y):
        batch_model = jax.vmap(
            model, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
        )
        pred_y, state = batch_model(x, state)
        return jnp.mean((pred_y[:, 0] - y) ** 2), state

    @eqx.filter_jit
    def make_step(model, state, opt_state, x, y):
        grads, state = eqx.filter_grad(compute_loss, has_aux=True)(model, state, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        return eqx.apply_updates(model, updates), state, opt_state

    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    y = jnp.sin(x[:, 0])
    optim = optax.sgd(0.1)
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    for _ in range(3):
        model, state, opt_state = make_step(model, state, opt_state, x, y)
    inference_model = eqx.nn.inference_mode(model)
    inference_model = eqx.Partial(inference_model, state=state)
    pred = jax.vmap(lambda x: inference_model(x)[0])(x)[:, 0]

    # Ensembling: a batch of models built and evaluated by filter_vmap.
    @eqx.filter_vmap
    def make_ensemble(key):
        return eqx.nn.MLP(3, 1, 4, 1, key=key)

    @eqx.filter_vmap(in_axes=(eqx.if_array(0), None))
    def evaluate_ensemble(model, x):
        return model(x)

    ensemble = make_ensemble(jr.split(jr.PRNGKey(4), 3))
    members = evaluate_ensemble(ensemble, x[0])
    assert members.shape == (3, 1)
    return jnp.concatenate([pred, members[:, 0]])


def vit_program(eqx):
    """A tiny vision transformer: patch embedding (Conv2d), LayerNorm, multi-head
    attention with rotary embeddings, an MLP block with dropout."""

    class Block(eqx.Module):
        norm1: eqx.nn.LayerNorm
        attention: eqx.nn.MultiheadAttention
        rope: eqx.nn.RotaryPositionalEmbedding
        norm2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP
        dropout: eqx.nn.Dropout

        def __init__(self, dim, heads, key):
            akey, mkey = jr.split(key)
            self.norm1 = eqx.nn.LayerNorm(dim)
            self.attention = eqx.nn.MultiheadAttention(heads, dim, key=akey)
            self.rope = eqx.nn.RotaryPositionalEmbedding(dim // heads)
            self.norm2 = eqx.nn.LayerNorm(dim)
            self.mlp = eqx.nn.MLP(dim, dim, 2 * dim, 1, jax.nn.gelu, key=mkey)
            self.dropout = eqx.nn.Dropout(0.1)

        def __call__(self, x, key):
            def process_heads(q, k, v):
                q = jax.vmap(self.rope, in_axes=1, out_axes=1)(q)
                k = jax.vmap(self.rope, in_axes=1, out_axes=1)(k)
                return q, k, v

            y = jax.vmap(self.norm1)(x)
            x = x + self.attention(y, y, y, process_heads=process_heads)
            y = jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))
            return x + self.dropout(y, key=key)

    class ViT(eqx.Module):
        patches: eqx.nn.Conv2d
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key):
            pkey, bkey, hkey = jr.split(key, 3)
            self.patches = eqx.nn.Conv2d(1, 8, kernel_size=4, stride=4, key=pkey)
            self.blocks = [Block(8, 2, bkey)]
            self.head = eqx.nn.Linear(8, 3, key=hkey)

        def __call__(self, image, key):
            x = self.patches(image).reshape(8, -1).T  # (patches, dim)
            for block, k in zip(self.blocks, jr.split(key, len(self.blocks))):
                x = block(x, k)
            return self.head(jnp.mean(x, axis=0))

    model = ViT(jr.PRNGKey(5))
    rng = np.random.default_rng(5)
    images = jnp.asarray(rng.normal(size=(4, 1, 8, 8)), jnp.float32)
    labels = jnp.asarray([0, 1, 2, 1])

    @eqx.filter_jit
    def loss(model, images, labels, key):
        keys = jr.split(key, images.shape[0])
        logits = jax.vmap(model)(images, keys)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    grads = eqx.filter_grad(loss)(model, images, labels, jr.PRNGKey(6))
    model = eqx.apply_updates(model, jax.tree_util.tree_map(lambda g: -0.1 * g, grads))
    evaluate = eqx.nn.inference_mode(model)
    logits = eqx.filter_jit(eqx.filter_vmap(evaluate))(
        images, jr.split(jr.PRNGKey(7), 4)
    )
    assert logits.shape == (4, 3)
    return logits.ravel()


def test_cnn_training():
    both(cnn_program)


def test_rnn_training_with_frozen_layers():
    both(rnn_program)


def test_stateful_batch_norm_and_ensembles():
    both(stateful_program)


def test_vision_transformer():
    both(vit_program)
