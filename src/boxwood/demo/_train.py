"""The demo's training: three modules, three optimizer states, one compiled step.

The loop never blocks on a step: each step's loss stays on the device, and the
epoch's losses are averaged and read once, with the held-out accuracy, at the end of
the epoch. So Python keeps dispatching steps while the device works.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import boxwood as bw
from boxwood import nn

from ._models import losses, make_models

RECONSTRUCTION_WEIGHT = 0.5


@dataclasses.dataclass
class Split:
    """Images and labels of one part of the data, on the device."""

    images: jax.Array
    labels: jax.Array

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def split_data(images: np.ndarray, labels: np.ndarray, seed: int):
    """Shuffle with `seed`, then split 70/15/15 into train, validation and test.

    Validation and test have the same size, so the evaluation step compiles once.
    """
    order = np.random.default_rng(seed).permutation(len(labels))
    held = int(0.15 * len(labels))
    parts = order[: -2 * held], order[-2 * held : -held], order[-held:]
    return tuple(Split(jnp.asarray(images[p]), jnp.asarray(labels[p])) for p in parts)


def make_steps(lr: float):
    """The optimizers and the compiled `train_step` and `evaluate` functions."""
    import optax

    # One optimizer per module: each keeps its own state and is updated in the same
    # compiled step as the others.
    optimizers = (
        optax.adamw(lr, weight_decay=1e-4),  # encoder
        optax.adam(lr),  # classifier head
        optax.adam(lr / 2),  # decoder: the auxiliary task learns more slowly
    )

    def objective(models, images, labels, key):
        encoder, classifier, decoder = models
        xent, recon = losses(encoder, classifier, decoder, images, labels, key)
        return xent + RECONSTRUCTION_WEIGHT * recon, xent

    @bw.filter_jit
    def train_step(
        encoder, classifier, decoder, enc_state, cls_state, dec_state, batch, key
    ):
        images, labels = batch
        models = (encoder, classifier, decoder)
        (_, xent), grads = bw.filter_value_and_grad(objective, has_aux=True)(
            models, images, labels, key
        )
        new_models, new_states = [], []
        for opt, model, grad, state in zip(
            optimizers, models, grads, (enc_state, cls_state, dec_state)
        ):
            params = bw.filter(model, bw.is_inexact_array)
            updates, state = opt.update(grad, state, params)
            new_models.append(bw.apply_updates(model, updates))
            new_states.append(state)
        return (*new_models, *new_states, xent)

    @bw.filter_jit
    def evaluate(encoder, classifier, images, labels):
        logits = jax.vmap(lambda x: classifier(encoder(x)))(images)
        return jnp.mean(jnp.argmax(logits, axis=1) == labels)

    return optimizers, train_step, evaluate


@dataclasses.dataclass
class History:
    """Per-epoch train loss and validation accuracy, and the step rate."""

    loss: list[float] = dataclasses.field(default_factory=list)
    accuracy: list[float] = dataclasses.field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0


def accuracy(evaluate, models, split: Split):
    """Accuracy of `models` on `split` in inference mode (dropout off), on device."""
    encoder, classifier = nn.inference_mode(models[:2])
    return evaluate(encoder, classifier, split.images, split.labels)


def train(
    opts,
    train_set: Split,
    val_set: Split,
    report: Callable[[int, float, float], None],
    tick: Callable[[], object],
):
    """Train for `opts.epochs`; returns `(models, optimizer_states, train_step,
    evaluate, history)`.

    `report(epoch, loss, accuracy)` runs once per epoch; `tick()` once per step.
    """
    key = jax.random.key(opts.seed)
    key, init_key = jax.random.split(key)
    image_size = int(np.prod(train_set.images.shape[1:]))
    models = make_models(image_size, 10, key=init_key)
    optimizers, train_step, evaluate = make_steps(opts.lr)
    states = tuple(
        opt.init(bw.filter(m, bw.is_inexact_array))
        for opt, m in zip(optimizers, models)
    )
    steps = len(train_set) // opts.batch_size
    history = History()
    start = time.perf_counter()
    for epoch in range(1, opts.epochs + 1):
        key, shuffle_key = jax.random.split(key)
        order = jax.random.permutation(shuffle_key, len(train_set))[
            : steps * opts.batch_size
        ]
        images = train_set.images[order].reshape(
            steps, opts.batch_size, *train_set.images.shape[1:]
        )
        labels = train_set.labels[order].reshape(steps, opts.batch_size)
        step_keys = jax.random.split(key, steps + 1)
        key = step_keys[0]
        epoch_losses = []
        for i in range(steps):
            args: tuple = (*models, *states, (images[i], labels[i]), step_keys[i + 1])
            *models_states, loss = train_step(*args)
            models, states = tuple(models_states[:3]), tuple(models_states[3:])
            epoch_losses.append(loss)  # stays on the device: no sync per step
            tick()
        # The one read of the epoch: mean loss and validation accuracy together.
        mean_loss = float(jnp.mean(jnp.stack(epoch_losses)))
        acc = float(accuracy(evaluate, models, val_set))
        history.loss.append(mean_loss)
        history.accuracy.append(acc)
        report(epoch, mean_loss, acc)
    history.seconds = time.perf_counter() - start
    history.steps = steps * opts.epochs
    return models, states, train_step, evaluate, history
