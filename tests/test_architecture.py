"""The structural measures of `src/boxwood` (benchmarks/architecture.py) hold:
no import cycle at all, no Python file over 500 lines, no function over 60 lines
in Python or 100 in C, and at most 8 private names imported across files (the aim
in src/boxwood/_jit/README.md, "Measures", is 15; the count only goes down)."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Where the measures stand: each may only go down (to zero for the lists).
FILES_OVER_500: set[str] = set()
PRIVATE_IMPORTS_AT_MOST = 8
LONG_PYTHON_FUNCTIONS: set[str] = set()
LONG_C_FUNCTIONS: set[str] = set()


@pytest.fixture(scope="module")
def measures():
    spec = importlib.util.spec_from_file_location(
        "architecture", ROOT / "benchmarks" / "architecture.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure()


def test_no_import_cycles(measures):
    assert measures["import_cycles"] == []


def test_files_over_500_lines_only_shrink(measures):
    assert {name for name, _ in measures["files_over_500_lines"]} == FILES_OVER_500


def test_private_names_imported_across_files_only_shrink(measures):
    assert len(measures["private_names_imported_across_files"]) <= (
        PRIVATE_IMPORTS_AT_MOST
    )


def test_long_functions_only_shrink(measures):
    python = {name for name, _ in measures["python_functions_over_60_lines"]}
    c = {name for name, _ in measures["c_functions_over_100_lines"]}
    assert python == LONG_PYTHON_FUNCTIONS
    assert c == LONG_C_FUNCTIONS


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "architecture", ROOT / "benchmarks" / "architecture.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert module.cycles(edges) == [["a", "b", "c"]]
