"""`--plot`: the loss and accuracy curves as a PNG (needs matplotlib)."""

from __future__ import annotations

import pathlib

from ._cli import DemoError


def plot_curves(history, path: pathlib.Path) -> pathlib.Path:
    """Write train loss and validation accuracy per epoch to `path`; returns it."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise DemoError(
            '--plot needs matplotlib; install the plot extra: pip install -e ".[plot]" '
            "in a clone of boxwood (or pip install matplotlib), or run without --plot"
        ) from None
    matplotlib.use("Agg")  # files only: no window, works without a display
    from matplotlib import pyplot as plt

    epochs = range(1, len(history.loss) + 1)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_loss.plot(epochs, history.loss, marker="o")
    ax_loss.set(xlabel="epoch", ylabel="train cross-entropy", title="Training loss")
    ax_acc.plot(epochs, history.accuracy, marker="o", color="tab:green")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="Validation accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
