"""The suite's one run of each notebook in notebooks/ (collected by
notebooks/conftest.py), checked by nbval against the outputs committed with it.

nbval runs a notebook's code cells in one kernel and compares each cell's outputs
with the committed ones, after the substitutions of notebooks/sanitize.cfg (the
file `--nbval-sanitize-with` would name: timings, addresses, temporary paths,
rounding-level differences, and the losses, accuracies and statistics a training
run reaches, which another CPU's rounding changes). It makes one pytest item per cell; here the cells
of a notebook are one item (`NotebookRun`), which runs nbval's own cell items in
order, so that pytest-xdist's work stealing never moves a cell of a notebook to
another worker (and another kernel).

The kernel runs with the environment of `kernel_env`: the suite's compile flags
on the CPU, as for every child process (tests/_child_flags.py), and on one core
(`one_core`): XLA's CPU results depend on how many threads share a product (the
training notebook's classifier reached 86.0% on two threads, 84.4% on one), and
one core makes them the same on every machine with the same CPU (another vector
width still changes a trained value's digits: sanitize.cfg). Run as a script,
this module runs notebooks with that environment and writes their outputs into
them, which is how the committed outputs are made:

    python tests/_notebook_run.py notebooks/quickstart.ipynb
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import pytest
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, RunningKernel
from nbval.plugin import IPyNbFile, NbCellError

from _child_flags import (
    child_env,
    one_core,
    quick_cpu_compiles,
    xla_flags_for_running,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "notebooks" / "sanitize.cfg"
# hundreds of training steps: the kernel compiles for running them
RUNS_LONG = {"training.ipynb"}


def kernel_env(notebook: pathlib.Path) -> dict[str, str]:
    """The environment of the kernel that runs `notebook`."""
    quick_cpu_compiles()  # already done where tests/conftest.py ran
    env = child_env()
    if notebook.name in RUNS_LONG:
        env["XLA_FLAGS"] = xla_flags_for_running()
    return env


class NotebookFile(IPyNbFile):
    """A notebook, run by nbval in a kernel of `kernel_env`, as one item."""

    def setup(self) -> None:
        saved = dict(os.environ)
        os.environ.update(kernel_env(self.path))  # the kernel inherits it
        try:
            with one_core():  # the kernel on one core: see the module docstring
                self.kernel = RunningKernel(
                    CURRENT_ENV_KERNEL_NAME,  # this Python, as `--nbval-current-env`
                    cwd=str(self.path.parent),
                    startup_timeout=self.config.option.nbval_kernel_startup_timeout,
                )
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.setup_sanitize_files()

    def get_sanitize_files(self) -> list[str]:
        return [str(SANITIZE)]

    def collect(self) -> Any:
        cells = list(super().collect())
        yield NotebookRun.from_parent(self, name=self.path.name, cells=cells)


class NotebookRun(pytest.Item):
    """Every code cell of a notebook, run and compared by nbval, in order."""

    def __init__(self, *, cells: list, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cells = cells
        self.failed: Any = None

    def runtest(self) -> None:
        for cell in self.cells:
            cell.setup()
            try:
                cell.runtest()
            except NbCellError:
                self.failed = cell
                raise

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if self.failed is not None:
            return self.failed.repr_failure(excinfo)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int, str]:
        return self.path, 0, f"{self.path.name}: every cell, compared"


def refresh(paths: list[str]) -> None:
    """Run each notebook with `kernel_env` and write its outputs into it."""
    import nbclient
    import nbformat

    for name in paths:
        path = pathlib.Path(name).resolve()
        notebook = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            notebook, timeout=600, kernel_name="python3", record_timing=False
        )
        with one_core():
            client.execute(cwd=str(path.parent), env=kernel_env(path))
        nbformat.write(notebook, path)
        print("refreshed", path.relative_to(ROOT))


if __name__ == "__main__":
    refresh(sys.argv[1:])
