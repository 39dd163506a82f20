"""The main demo: train a classifier on the bundled handwritten digits.

Run it with `boxwood-demo` (or `python -m boxwood.demo`). It shows a model that is a
pytree, a whole training step compiled by `filter_jit` without any
`static_argnums`, train/eval modes with `nn.inference_mode`, and the compile
counter: one compile for training, one for evaluation.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import boxwood as bw
from boxwood import nn
from boxwood.data import load_digits


class Classifier(bw.Module):
    """An MLP with dropout for 8x8 digit images."""

    hidden: nn.Linear
    dropout: nn.Dropout
    out: nn.Linear

    def __init__(self, width: int = 64, p: float = 0.1, *, key):
        k1, k2 = jax.random.split(key)
        self.hidden = nn.Linear(64, width, key=k1)
        self.dropout = nn.Dropout(p)
        self.out = nn.Linear(width, 10, key=k2)

    def __call__(self, image, *, key=None):
        h = jax.nn.relu(self.hidden(image.reshape(64)))
        return self.out(self.dropout(h, key=key))


def loss_fn(model, images, labels, key):
    keys = jax.random.split(key, images.shape[0])
    logits = jax.vmap(lambda x, k: model(x, key=k))(images, keys)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def main(argv: list[str] | None = None) -> None:
    import optax  # the `train` extra

    parser = argparse.ArgumentParser(
        prog="boxwood-demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    images, labels = load_digits()
    perm = np.random.default_rng(args.seed).permutation(len(labels))
    split = int(0.8 * len(labels))
    train_idx, test_idx = perm[:split], perm[split:]
    x_train, y_train = jnp.asarray(images[train_idx]), jnp.asarray(labels[train_idx])
    x_test, y_test = jnp.asarray(images[test_idx]), jnp.asarray(labels[test_idx])

    key = jax.random.key(args.seed)
    key, init_key = jax.random.split(key)
    model = Classifier(key=init_key)
    optimizer = optax.adam(3e-3)
    opt_state = optimizer.init(bw.filter(model, bw.is_inexact_array))

    @bw.filter_jit(donate="all-except-first")
    def train_step(model, opt_state, images, labels, key):
        loss, grads = bw.filter_value_and_grad(loss_fn)(model, images, labels, key)
        updates, opt_state = optimizer.update(grads, opt_state)
        return bw.apply_updates(model, updates), opt_state, loss

    @bw.filter_jit
    def accuracy(model, images, labels):
        logits = jax.vmap(model)(images)
        return jnp.mean(jnp.argmax(logits, axis=1) == labels)

    print(
        f"boxwood {bw.__version__} | jax {jax.__version__} on {jax.devices()[0].platform}"
    )
    print(f"digits: {split} train / {len(labels) - split} test images")
    print(bw.tree_pformat(model))
    start = time.perf_counter()
    steps = split // args.batch_size
    for epoch in range(1, args.epochs + 1):
        key, shuffle_key = jax.random.split(key)
        order = jax.random.permutation(shuffle_key, split)
        total = 0.0
        for i in range(steps):
            idx = order[i * args.batch_size : (i + 1) * args.batch_size]
            key, step_key = jax.random.split(key)
            model, opt_state, loss = train_step(
                model, opt_state, x_train[idx], y_train[idx], step_key
            )
            total += float(loss)
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            acc = accuracy(nn.inference_mode(model), x_test, y_test)
            print(
                f"epoch {epoch:3d}  loss {total / steps:.4f}  test accuracy {float(acc):.3f}"
            )
    elapsed = time.perf_counter() - start
    info = train_step.cache_info()
    print(
        f"trained in {elapsed:.1f}s: {info.hits + info.misses} steps, {info.traces} compile(s) of the training step"
    )
    print(
        f"evaluation compiled {accuracy.cache_info().traces} time(s) (inference mode is static)"
    )


if __name__ == "__main__":
    main()
