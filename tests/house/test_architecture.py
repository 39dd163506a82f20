"""The structural measures of `src/boxwood` (tests/_measures.py) hold:
no import cycle at all, no Python file over 500 lines, no function over 60 lines
(docstrings not counted), and no private name imported across files (the count
only goes down). And its structure (tests/_structure.py): no cycle between
packages (no arrow up), no private name used across packages (imported or read as
an attribute), no private module of another package imported (past its
`__init__.py`), no module patched at import time, no file name used twice, and
each package's README lists exactly its files."""

import ast

import pytest

import _measures

# Where the measures stand: each may only go down (to zero for the lists).
FILES_OVER_500: set[str] = set()
PRIVATE_IMPORTS_AT_MOST = 0
# None: `Module`'s display hooks are its own methods (`_display/` sits below
# `_module/` and reads modules through the dataclass protocol).
IMPORT_TIME_PATCHES: dict[str, int] = {}
LONG_PYTHON_FUNCTIONS: set[str] = set()
# Imports of another package's private module (past its `__init__.py`): none.
# What `models/` shares with `nn/` sits below both, in a private package whose
# `__init__.py` offers it (`_kernels/`, `_init/`), and the announce primitive of
# `debug/` and `internal/` in `_announce.py`.
PRIVATE_MODULE_IMPORTS: set[str] = set()


@pytest.fixture(scope="module")
def measures():
    return _measures.measure()


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


def test_a_functions_docstring_is_not_counted():
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    doc = '    """One line.\n\n' + "    more\n" * 30 + '    """\n'
    (with_doc,) = ast.parse(f"def f():\n{doc}{body}\n").body
    (without,) = ast.parse(f"def f():\n{body}\n").body
    length = _measures.function_length
    assert length(with_doc) == length(without) == 60
    (longer,) = ast.parse(f"def f():\n{doc}{body}\n    y = 1\n").body
    assert length(longer) == 61


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _measures.cycles(edges) == [["a", "b", "c"]]


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


def test_no_arrow_points_up_between_packages():
    from _structure import package_cycles

    assert package_cycles() == []


def test_no_private_name_is_used_across_packages():
    from _structure import private_uses

    assert private_uses() == []


def test_no_package_imports_another_packages_private_module():
    """What a package offers the others is in its `__init__.py`: `_jit` takes the
    flat form from `_module`'s, `models/` the checkpoint seam from
    `_checkpoint`'s (see _checkpoint/README.md) and the attention kernels from
    `_kernels`'."""
    from _structure import private_module_imports

    assert set(private_module_imports()) == PRIVATE_MODULE_IMPORTS


def test_no_module_patches_another_at_import_time():
    from _structure import import_time_patches

    found: dict[str, int] = {}
    for where in import_time_patches():
        path = where.rsplit(":", 1)[0]
        found[path] = found.get(path, 0) + 1
    assert found == IMPORT_TIME_PATCHES


def test_each_file_name_means_one_thing():
    from _structure import repeated_file_names

    assert repeated_file_names() == {}


def test_each_package_readme_lists_exactly_its_files():
    from _structure import readme_mismatches

    assert readme_mismatches() == {}


def _write(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "src" / "boxwood" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_structure_scans_find_what_they_look_for(tmp_path):
    from _structure import (
        import_time_patches,
        package_cycles,
        private_module_imports,
        private_uses,
        readme_mismatches,
        repeated_file_names,
    )

    _write(
        tmp_path,
        {
            "__init__.py": "from . import _top\n",
            "_top.py": "from ._pkg._a import thing\nfrom ._pkg import _a\n"
            "x = _a._hidden\n_a.hook = thing\nimport boxwood._pkg._b\n",
            "_pkg/__init__.py": "",
            "_pkg/README.md": "- `_a.py`: a.\n- `_gone.py`: gone.\n",
            "_pkg/_a.py": "from .._top import _private\n",
            "_pkg/_b.py": "",
            "_other/__init__.py": "",
            "_other/_a.py": "",
        },
    )
    src = tmp_path / "src"
    assert package_cycles(src) == [["boxwood._pkg", "boxwood._top"]]
    assert private_uses(src) == [
        "boxwood._pkg._a: boxwood._top._private",
        "boxwood._top: boxwood._pkg._a._hidden",
    ]
    # (`_pkg/_a.py` imports `_top.py`, a file in `boxwood`: its own interface)
    assert private_module_imports(src) == [
        "boxwood._top: boxwood._pkg._a",
        "boxwood._top: boxwood._pkg._b",
    ]
    assert import_time_patches(src) == ["src/boxwood/_top.py:4"]
    assert repeated_file_names(src) == {"_a.py": ["_other/_a.py", "_pkg/_a.py"]}
    assert readme_mismatches(src) == {
        "boxwood": ["missing README"],
        "boxwood/_other": ["missing README"],
        "boxwood/_pkg": [
            "not listed: _b.py",
            "no such file: _gone.py",
        ],
    }
