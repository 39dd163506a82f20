"""The structural measures of `src/boxwood` (benchmarks/architecture.py) hold:
no import cycle at all, no Python file over 500 lines, no function over 60 lines
(docstrings not counted), and at most 8 private names imported across files (the
aim in src/boxwood/_jit/README.md, "Measures", is 15; the count only goes down)."""

import ast
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Where the measures stand: each may only go down (to zero for the lists).
FILES_OVER_500: set[str] = set()
PRIVATE_IMPORTS_AT_MOST = 8
LONG_PYTHON_FUNCTIONS: set[str] = set()


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
    assert python == LONG_PYTHON_FUNCTIONS


def _architecture():
    spec = importlib.util.spec_from_file_location(
        "architecture", ROOT / "benchmarks" / "architecture.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_functions_docstring_is_not_counted():
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    doc = '    """One line.\n\n' + "    more\n" * 30 + '    """\n'
    (with_doc,) = ast.parse(f"def f():\n{doc}{body}\n").body
    (without,) = ast.parse(f"def f():\n{body}\n").body
    module = _architecture()
    assert module.function_length(with_doc) == module.function_length(without) == 60
    (longer,) = ast.parse(f"def f():\n{doc}{body}\n    y = 1\n").body
    assert module.function_length(longer) == 61


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    module = _architecture()
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert module.cycles(edges) == [["a", "b", "c"]]


def _private_checkpoint_imports(path: pathlib.Path, package: str) -> list[str]:
    """The imports in `path` (a module of `package`) of a private submodule of
    `boxwood._checkpoint`, as `line: module`."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from .._checkpoint import _format` imports a submodule by name
            modules = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["boxwood", "_checkpoint"] and len(parts) > 2:
                hit = f"{node.lineno}: {'.'.join(parts[:3])}"
                if parts[2].startswith("_") and hit not in found:
                    found.append(hit)
    return found


def test_models_import_only_the_checkpoint_interface():
    """`boxwood.models` uses `boxwood._checkpoint` through the names of its
    `__init__.py` (see _checkpoint/README.md), never its private files."""
    models = ROOT / "src" / "boxwood" / "models"
    found = {
        path.name: hits
        for path in sorted(models.rglob("*.py"))
        if (hits := _private_checkpoint_imports(path, "boxwood.models"))
    }
    assert found == {}


def test_the_checkpoint_import_scan_finds_private_imports(tmp_path):
    source = (
        "from .._checkpoint._format import read_header\n"
        "from .._checkpoint import _atomic, assemble\n"
        "import boxwood._checkpoint._leaves\n"
        "from boxwood._checkpoint import state_dict\n"
        "from .. import _checkpoint\n"
    )
    (tmp_path / "m.py").write_text(source)
    assert _private_checkpoint_imports(tmp_path / "m.py", "boxwood.models") == [
        "1: boxwood._checkpoint._format",
        "2: boxwood._checkpoint._atomic",
        "3: boxwood._checkpoint._leaves",
    ]


def test_comments_point_at_files_and_names_that_exist():
    from _stale_pointers import stale_pointers

    assert stale_pointers() == []


def test_the_pointer_scan_finds_a_stale_pointer(tmp_path):
    from _stale_pointers import stale_pointers

    package = tmp_path / "src" / "boxwood" / "_jit"
    package.mkdir(parents=True)
    (package.parent / "_module").mkdir()
    (package.parent / "_module" / "__init__.py").write_text("")
    (package / "_cache.py").write_text(
        '"""See `_jit.py` for the flow, and `_module._Field` for fields."""\n'
    )
    assert stale_pointers(tmp_path) == [
        "src/boxwood/_jit/_cache.py:1: _jit.py",
        "src/boxwood/_jit/_cache.py:1: _module._Field",
    ]
