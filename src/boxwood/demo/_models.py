"""The demo's three modules: an encoder with dropout, a classifier head and a decoder
that reconstructs the image from the encoder's features (an auxiliary loss)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

import boxwood as bw
from boxwood import nn


class Encoder(bw.Module):
    """Image -> features: two linear layers with ReLU and dropout between them."""

    hidden: nn.Linear
    dropout: nn.Dropout
    features: nn.Linear

    def __init__(self, in_size: int, width: int, out_size: int, p: float, *, key):
        k1, k2 = jax.random.split(key)
        self.hidden = nn.Linear(in_size, width, key=k1)
        self.dropout = nn.Dropout(p)
        self.features = nn.Linear(width, out_size, key=k2)

    def __call__(
        self, image: Float[Array, "..."], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, " features"]:
        h = jax.nn.relu(self.hidden(image.reshape(-1)))
        return jax.nn.relu(self.features(self.dropout(h, key=key)))


class Classifier(bw.Module):
    """Features -> class logits."""

    out: nn.Linear

    def __init__(self, in_size: int, classes: int, *, key):
        self.out = nn.Linear(in_size, classes, key=key)

    def __call__(self, features: Float[Array, " features"]) -> Float[Array, " classes"]:
        return self.out(features)


class Decoder(bw.Module):
    """Features -> a reconstruction of the (flattened) image, in [0, 1]."""

    out: nn.Linear

    def __init__(self, in_size: int, image_size: int, *, key):
        self.out = nn.Linear(in_size, image_size, key=key)

    def __call__(self, features: Float[Array, " features"]) -> Float[Array, " pixels"]:
        return jax.nn.sigmoid(self.out(features))


def make_models(image_size: int, classes: int, *, key: PRNGKeyArray):
    """The `(encoder, classifier, decoder)` for images of `image_size` pixels."""
    k1, k2, k3 = jax.random.split(key, 3)
    width, features = 128, 64
    return (
        Encoder(image_size, width, features, p=0.1, key=k1),
        Classifier(features, classes, key=k2),
        Decoder(features, image_size, key=k3),
    )


def losses(encoder, classifier, decoder, images, labels, key):
    """Mean cross-entropy of the classifier and mean squared reconstruction error."""
    keys = jax.random.split(key, images.shape[0])
    features = jax.vmap(lambda x, k: encoder(x, key=k))(images, keys)
    logp = jax.nn.log_softmax(jax.vmap(classifier)(features))
    xent = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))
    pixels = images.reshape(images.shape[0], -1)
    recon = jnp.mean((jax.vmap(decoder)(features) - pixels) ** 2)
    return xent, recon
