"""The test suite's run of the notebooks in this folder: each notebook runs once,
checked by nbval against its committed outputs (see tests/_notebook_run.py)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from _notebook_run import NotebookFile  # noqa: E402

# not a test module (as tests/conftest.py is "conftest" already, pytest's
# doctest collector could not import this one under that name)
collect_ignore = ["conftest.py"]


def pytest_collect_file(file_path, parent):
    # an executed copy (`jupyter execute ... --output=NAME-run`) is not a notebook
    if file_path.suffix == ".ipynb" and not file_path.stem.endswith("-run"):
        return NotebookFile.from_parent(parent, path=file_path)
    return None
