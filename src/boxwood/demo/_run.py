"""The demo from start to end: data, training, report, checkpoint and reload."""

from __future__ import annotations

import sys

import jax
import numpy as np

import boxwood as bw

from ._cli import DemoError, Options, check_before_training


def _require_optax():
    try:
        import optax  # noqa: F401
    except ModuleNotFoundError:
        raise DemoError(
            'the demo needs optax; install the train extra: pip install -e ".[train]" '
            "in a clone of boxwood (or pip install optax)"
        ) from None


def load_data(spec: str) -> tuple[np.ndarray, np.ndarray, str]:
    """`(images, labels, description)` for `--data digits` or `--data mnist:DIR`."""
    from boxwood.data import load_digits, load_mnist

    if spec == "digits":
        images, labels = load_digits()
        return images, labels, "UCI handwritten digits (bundled, 8x8)"
    directory = spec.partition(":")[2]
    try:
        images, labels = load_mnist(directory)
    except (OSError, ValueError) as error:
        raise DemoError(f"--data {spec}: {error}") from None
    return images, labels, f"MNIST from {directory} (28x28)"


def _progress(opts: Options, total: int):
    """`(tick, write, close)`: a tqdm bar on a terminal, plain lines otherwise."""
    if opts.progress and sys.stdout.isatty():
        try:
            from tqdm import tqdm
        except ModuleNotFoundError:
            pass
        else:
            bar = tqdm(total=total, unit="step", dynamic_ncols=True, leave=False)
            return (lambda: bar.update(1)), tqdm.write, bar.close
    return (lambda: None), print, (lambda: None)


def run(opts: Options) -> None:
    """Run the demo with validated options."""
    _require_optax()
    check_before_training(opts)
    images, labels, description = load_data(opts.data)
    from ._train import accuracy, split_data, train

    train_set, val_set, test_set = split_data(images, labels, opts.seed)
    if opts.batch_size > len(train_set):
        raise DemoError(
            f"--batch-size {opts.batch_size} is larger than the training set "
            f"({len(train_set)} images); use at most {len(train_set)}"
        )
    print(f"boxwood {bw.__version__} | jax {jax.__version__} on "
          f"{jax.devices()[0].platform}")  # fmt: skip
    print(f"data: {description}: {len(train_set)} train / {len(val_set)} validation "
          f"/ {len(test_set)} test images")  # fmt: skip
    steps = len(train_set) // opts.batch_size
    tick, write, close = _progress(opts, steps * opts.epochs)

    def report(epoch: int, loss: float, acc: float) -> None:
        write(f"epoch {epoch:3d}/{opts.epochs}  train loss {loss:.4f}  "
              f"validation accuracy {acc:.3f}")  # fmt: skip

    try:
        models, states, train_step, evaluate, history = train(
            opts, train_set, val_set, report, tick
        )
    finally:
        close()
    print(bw.summary(dict(zip(("encoder", "classifier", "decoder"), models))))
    test_acc = float(accuracy(evaluate, models, test_set))
    print(f"test accuracy {test_acc:.3f} ({len(test_set)} images)")
    print(f"compiles: train_step {train_step.cache_info().traces}, "
          f"evaluate {evaluate.cache_info().traces} (from cache_info())")  # fmt: skip
    steps = f"{history.steps} step{'' if history.steps == 1 else 's'}"
    print(f"{steps} in {history.seconds:.1f}s: "
          f"{steps_per_second(history.steps, history.seconds)} (compilation included)")  # fmt: skip

    checkpoint = opts.out / "demo.safetensors"
    bw.save(
        checkpoint, {"models": models, "optimizer_states": states},
        metadata={"data": opts.data, "epochs": opts.epochs, "seed": opts.seed,
                  "test_accuracy": test_acc},
    )  # fmt: skip
    print(f"checkpoint written to {checkpoint}")
    if opts.plot:
        from ._plot import plot_curves

        print(f"curves written to {plot_curves(history, opts.out / 'curves.png')}")
    _reload_and_report(checkpoint, states, evaluate, train_set, test_set, test_acc)


def _reload_and_report(
    checkpoint, states, evaluate, train_set, test_set, test_acc: float
) -> None:
    """Load the checkpoint back and report its test accuracy against `test_acc`."""
    from ._train import accuracy

    # Reload into the structure of freshly built modules; `filter_eval_shape` builds
    # that structure without allocating or initialising any array.
    like = {
        "models": bw.filter_eval_shape(_fresh_models, train_set),
        "optimizer_states": jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), states
        ),
    }
    reloaded = bw.load(checkpoint, like)
    again = float(accuracy(evaluate, reloaded["models"], test_set))
    same = "same as before" if again == test_acc else "DIFFERENT from before"
    saved = bw.read_metadata(checkpoint)["test_accuracy"]
    print(f"reloaded checkpoint: test accuracy {again:.3f} ({same}; "
          f"metadata says {saved:.3f}); evaluate compiled "
          f"{times(evaluate.cache_info().traces)} in all")  # fmt: skip


def times(n: int) -> str:
    """`once`, `twice`, `3 times`."""
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def steps_per_second(steps: int, seconds: float) -> str:
    """A rate with the digits that matter: `1200 steps/s`, `3.4 steps/s`,
    `0.31 steps/s` (a tiny run is mostly compilation), `1 step/s`."""
    rate = steps / seconds if seconds > 0 else float("inf")
    text = f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"
    return f"{text} step{'' if text == '1' else 's'}/s"


def _fresh_models(train_set):
    """Freshly initialised modules of the trained ones' structure (any key)."""
    from ._models import make_models

    image_size = int(np.prod(train_set.images.shape[1:]))
    return make_models(image_size, 10, key=jax.random.key(0))
