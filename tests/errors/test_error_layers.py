"""Every layer of boxwood.nn rejects an input of the wrong shape with a message that
names the layer (with its configuration), what it expected and what it got."""

import inspect

import jax
import jax.numpy as jnp
import jax.random as jr
import pytest

from boxwood import nn

KEY = jr.key(0)


def ones(*shape):
    return jnp.ones(shape)


def _batch_norm(x):
    layer = nn.BatchNorm(4, "batch")
    return jax.vmap(layer, axis_name="batch", in_axes=(0, None))(x, None)


# layer -> (a call with a badly shaped input, the message it must raise)
CASES = {
    "Linear": (
        lambda: nn.Linear(3, 4, key=KEY)(ones(5)),
        r"Linear\(in_features=3\): expected input of shape \(3,\), got \(5,\)",
    ),
    "Conv": (
        lambda: nn.Conv(1, 2, 3, 3, key=KEY)(ones(4, 8)),
        r"Conv\(num_spatial_dims=1, in_channels=2\): expected input of shape "
        r"\(2, length\), got \(4, 8\)",
    ),
    "Conv1d": (
        lambda: nn.Conv1d(2, 3, 3, key=KEY)(ones(4, 8)),
        r"Conv1d\(in_channels=2\): expected input of shape \(2, length\), got \(4, 8\)",
    ),
    "Conv2d": (
        lambda: nn.Conv2d(2, 3, 3, key=KEY)(ones(2, 8)),
        r"Conv2d\(in_channels=2\): expected input of shape \(2, height, width\), "
        r"got \(2, 8\)",
    ),
    "Conv3d": (
        lambda: nn.Conv3d(2, 3, 3, key=KEY)(ones(3, 8, 8, 8)),
        r"expected input of shape \(2, depth, height, width\), got \(3, 8, 8, 8\)",
    ),
    "ConvTranspose": (
        lambda: nn.ConvTranspose(1, 2, 3, 3, key=KEY)(ones(4, 8)),
        r"ConvTranspose\(.*\): expected input of shape \(2, length\), got \(4, 8\)",
    ),
    "ConvTranspose1d": (
        lambda: nn.ConvTranspose1d(2, 3, 3, key=KEY)(ones(4, 8)),
        r"ConvTranspose1d\(in_channels=2\): expected input of shape \(2, length\)",
    ),
    "ConvTranspose2d": (
        lambda: nn.ConvTranspose2d(2, 3, 3, key=KEY)(ones(4, 8, 8)),
        r"ConvTranspose2d\(in_channels=2\): expected input of shape "
        r"\(2, height, width\), got \(4, 8, 8\)",
    ),
    "ConvTranspose3d": (
        lambda: nn.ConvTranspose3d(2, 3, 3, key=KEY)(ones(2, 8, 8)),
        r"ConvTranspose3d\(in_channels=2\): expected input of shape "
        r"\(2, depth, height, width\), got \(2, 8, 8\)",
    ),
    "Pool": (
        lambda: nn.Pool(0.0, jax.lax.add, 2, 2)(ones(8, 8)),
        r"Pool\(.*\): expected input of shape \(channels, height, width\), got \(8, 8\)",
    ),
    "MaxPool1d": (
        lambda: nn.MaxPool1d(2)(ones(8)),
        r"MaxPool1d\(kernel_size=\(2,\)\): expected input of shape "
        r"\(channels, length\), got \(8,\)",
    ),
    "MaxPool2d": (
        lambda: nn.MaxPool2d(2)(ones(8, 8)),
        r"MaxPool2d\(kernel_size=\(2, 2\)\): expected input of shape "
        r"\(channels, height, width\), got \(8, 8\)",
    ),
    "MaxPool3d": (
        lambda: nn.MaxPool3d(2)(ones(8, 8, 8)),
        r"MaxPool3d\(.*\): expected input of shape \(channels, depth, height, width\)",
    ),
    "AvgPool1d": (
        lambda: nn.AvgPool1d(2)(ones(8)),
        r"AvgPool1d\(kernel_size=\(2,\)\): expected input of shape \(channels, length\)",
    ),
    "AvgPool2d": (
        lambda: nn.AvgPool2d(2)(ones(8)),
        r"AvgPool2d\(.*\): expected input of shape \(channels, height, width\), got \(8,\)",
    ),
    "AvgPool3d": (
        lambda: nn.AvgPool3d(2)(ones(1, 8, 8)),
        r"AvgPool3d\(.*\): expected input of shape \(channels, depth, height, width\)",
    ),
    "AdaptivePool": (
        lambda: nn.AdaptivePool(2, 1, jnp.max)(ones(8)),
        r"AdaptivePool\(.*\): expected input of shape \(channels, length\), got \(8,\)",
    ),
    "AdaptiveAvgPool1d": (
        lambda: nn.AdaptiveAvgPool1d(2)(ones(8)),
        r"AdaptiveAvgPool1d\(target_shape=\(2,\)\): expected input of shape "
        r"\(channels, length\)",
    ),
    "AdaptiveAvgPool2d": (
        lambda: nn.AdaptiveAvgPool2d(2)(ones(8)),
        r"AdaptiveAvgPool2d\(target_shape=\(2, 2\)\): expected input of shape "
        r"\(channels, height, width\), got \(8,\)",
    ),
    "AdaptiveAvgPool3d": (
        lambda: nn.AdaptiveAvgPool3d(2)(ones(8, 8)),
        r"AdaptiveAvgPool3d\(.*\): expected input of shape "
        r"\(channels, depth, height, width\)",
    ),
    "AdaptiveMaxPool1d": (
        lambda: nn.AdaptiveMaxPool1d(2)(ones(8)),
        r"AdaptiveMaxPool1d\(.*\): expected input of shape \(channels, length\)",
    ),
    "AdaptiveMaxPool2d": (
        lambda: nn.AdaptiveMaxPool2d(2)(ones(8)),
        r"AdaptiveMaxPool2d\(.*\): expected input of shape \(channels, height, width\)",
    ),
    "AdaptiveMaxPool3d": (
        lambda: nn.AdaptiveMaxPool3d(2)(ones(8)),
        r"AdaptiveMaxPool3d\(.*\): expected input of shape "
        r"\(channels, depth, height, width\)",
    ),
    "LayerNorm": (
        lambda: nn.LayerNorm(4)(ones(5)),
        r"LayerNorm\(shape=\(4,\)\): expected input of shape \(4,\), got \(5,\)",
    ),
    "RMSNorm": (
        lambda: nn.RMSNorm(4)(ones(5)),
        r"RMSNorm\(shape=\(4,\)\): expected input of shape \(4,\), got \(5,\)",
    ),
    "GroupNorm": (
        lambda: nn.GroupNorm(2, 4)(ones(6, 3)),
        r"GroupNorm\(groups=2, channels=4\): expected input of shape "
        r"\(4, \*spatial\), got \(6, 3\)",
    ),
    "BatchNorm": (
        lambda: _batch_norm(ones(2, 5)),
        r"BatchNorm\(input_size=4\): expected input of shape \(4, \.\.\.\), got \(5,\)",
    ),
    "Embedding": (
        lambda: nn.Embedding(10, 3, key=KEY)(jnp.array([1, 2])),
        r"Embedding\(num_embeddings=10, embedding_size=3\): expected a scalar index "
        r"of shape \(\), got \(2,\)\. For many indices use `jax.vmap",
    ),
    "MultiheadAttention": (
        lambda: nn.MultiheadAttention(2, 4, key=KEY)(
            ones(3, 5), ones(3, 4), ones(3, 4)
        ),
        r"MultiheadAttention\(num_heads=2, query_size=4\): expected query of shape "
        r"\(q_seq, 4\), got \(3, 5\)",
    ),
    "GRUCell": (
        lambda: nn.GRUCell(3, 4, key=KEY)(ones(3), ones(5)),
        r"GRUCell\(input_size=3, hidden_size=4\): expected hidden of shape \(4,\), "
        r"got \(5,\)",
    ),
    "LSTMCell": (
        lambda: nn.LSTMCell(3, 4, key=KEY)(ones(5), (ones(4), ones(4))),
        r"LSTMCell\(input_size=3, hidden_size=4\): expected input of shape \(3,\), "
        r"got \(5,\)",
    ),
    "RotaryPositionalEmbedding": (
        lambda: nn.RotaryPositionalEmbedding(4)(ones(3, 6)),
        r"RotaryPositionalEmbedding\(embedding_size=4\): expected input of shape "
        r"\(seq_len, 4\), got \(3, 6\)",
    ),
    "MLP": (
        lambda: nn.MLP(3, 2, 8, 2, key=KEY)(ones(4)),
        r"MLP\(in_size=3, out_size=2\): expected input of shape \(3,\), got \(4,\)",
    ),
    "PReLU": (
        lambda: nn.PReLU(jnp.ones(3))(ones(4, 5)),
        r"PReLU\(negative_slope.shape=\(3,\)\): the slope does not broadcast to the "
        r"input of shape \(4, 5\)",
    ),
}

# Classes of boxwood.nn without an input shape of their own, and why.
NO_INPUT_SHAPE = {
    "Dropout": "elementwise: any shape",
    "Identity": "returns its input",
    "Lambda": "calls the user's function",
    "Sequential": "its layers check their inputs",
    "Shared": "calls the user's module",
    "Stacked": "its layer checks the input",
    "SpectralNorm": "the wrapped layer checks the input",
    "WeightNorm": "the wrapped layer checks the input",
    "State": "not a layer",
    "StateIndex": "not a layer",
    "StatefulLayer": "a base class",
    "StaticFunction": "calls the user's function",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrong_input_shape_names_layer_expected_and_got(name):
    call, message = CASES[name]
    with pytest.raises(ValueError, match=message):
        call()


def test_every_layer_class_has_a_wrong_shape_case():
    classes = {n for n, v in vars(nn).items() if inspect.isclass(v) and n[0] != "_"}
    assert classes - set(CASES) - set(NO_INPUT_SHAPE) == set()
    assert set(CASES) | set(NO_INPUT_SHAPE) <= classes  # no stale names


def test_dropout_in_training_without_a_key():
    with pytest.raises(
        RuntimeError,
        match=r"Dropout\(p=0.5\) is in training mode \(`inference=False`\) and needs "
        r"a random key: call it as `dropout\(x, key=key\)`",
    ):
        nn.Dropout(0.5)(jnp.ones(3))
