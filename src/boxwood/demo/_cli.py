"""The demo's command line: options, and bad values refused with one clear line."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import pathlib
import sys
from typing import NoReturn


class DemoError(Exception):
    """A problem the user can fix (bad option, missing file or package): `main`
    prints its message as one line and exits with status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own error() prints the whole usage first; one line is enough.
        raise DemoError(f"{message} (see `{self.prog} --help`)")


@dataclasses.dataclass(frozen=True)
class Options:
    """The demo's settings after validation."""

    epochs: int = 12
    batch_size: int = 32
    lr: float = 2e-3
    seed: int = 0
    out: pathlib.Path = pathlib.Path("boxwood-demo-output")
    data: str = "digits"
    plot: bool = False
    progress: bool = True


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _learning_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"must be a positive finite number such as 2e-3, got {text}"
        )
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number, got {text!r}"
        ) from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32), got {value}")
    return value


def _data(text: str) -> str:
    if text == "digits" or (text.startswith("mnist:") and len(text) > len("mnist:")):
        return text
    raise argparse.ArgumentTypeError(
        f"must be `digits` or `mnist:DIR` (a folder of MNIST IDX files), got {text!r}"
    )


_DESCRIPTION = (
    "Train an encoder, a classifier head and a reconstruction decoder, each with its "
    "own optimizer, in one compiled step, on the bundled UCI handwritten digits (or "
    "MNIST IDX files). No download."
)


def parser() -> argparse.ArgumentParser:
    """The `boxwood-demo` argument parser."""
    d = Options()
    p = _Parser(prog="boxwood-demo", description=_DESCRIPTION)
    p.add_argument(
        "--epochs",
        type=_positive_int,
        default=d.epochs,
        help=f"passes over the training set (default {d.epochs})",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=d.batch_size,
        help=f"images per step, at most the training set (default {d.batch_size})",
    )
    p.add_argument(
        "--lr",
        type=_learning_rate,
        default=d.lr,
        help=f"Adam learning rate (default {d.lr})",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=d.seed,
        help="seed for initialisation, shuffling and dropout; a run is "
        f"reproducible for a seed (default {d.seed})",
    )
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=d.out,
        help=f"folder for the checkpoint and plot (default ./{d.out})",
    )
    p.add_argument(
        "--data",
        type=_data,
        default=d.data,
        help="`digits` (bundled, default) or `mnist:DIR`, a folder of "
        "MNIST IDX files such as t10k-images-idx3-ubyte.gz",
    )
    p.add_argument(
        "--plot",
        action="store_true",
        help="write loss and accuracy curves to OUT/curves.png (matplotlib)",
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="plain per-epoch lines instead of a progress bar",
    )
    return p  # fmt: skip


def parse(argv: list[str] | None) -> Options:
    """Parse and validate `argv` (default `sys.argv[1:]`); raises `DemoError`."""
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if ns.out.exists() and not ns.out.is_dir():
        raise DemoError(f"--out {ns.out} exists and is not a folder")
    return Options(**vars(ns))


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def check_before_training(opts: Options) -> None:
    """Everything the end of the run needs, checked before training starts: the
    packages of the options given (`--plot`: matplotlib) and a writable `--out`
    folder (made here when missing). Raises `DemoError`."""
    if opts.plot and not _importable("matplotlib"):
        raise DemoError(
            '--plot needs matplotlib; install the plot extra: pip install -e ".[plot]" '
            "in a clone of boxwood (or pip install matplotlib), or run without --plot"
        )
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise DemoError(
            f"--out {opts.out}: cannot create this folder ({reason}); "
            "give a folder you can write to"
        ) from None
    if not os.access(opts.out, os.W_OK | os.X_OK):
        raise DemoError(
            f"--out {opts.out}: this folder is not writable; give a folder you can "
            "write to"
        )
