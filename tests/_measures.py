"""Structural measures of `src/boxwood` (not timings), for
tests/house/test_architecture.py: import cycles, file and function sizes, private names
imported across files.

    python tests/_measures.py          # prints the measures
    python tests/_measures.py --json   # the same as JSON

Every import counts for the cycle measure: at module level, inside functions and
under `TYPE_CHECKING`. `from pkg import name` is an edge to `pkg.name` when that is a
module, else to `pkg`; parent packages that Python initialises on the way are not
edges (else every module would depend on `boxwood/__init__.py`). A private name is
a name starting with `_` imported from another boxwood file (module names excluded).
A function's length is its lines, from `def` to its last line, less its docstring's
(documentation is never trimmed to meet the limit). `tests/house/test_architecture.py`
keeps these numbers from getting worse.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "boxwood"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(modules: dict[str, Path]):
    """Yield `(importer, imported_module, private_names)` for every import statement
    that names a boxwood module."""
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == PACKAGE:
                        yield name, alias.name, []
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, is_package, node)
                if target.split(".")[0] != PACKAGE:
                    continue
                private = []
                plain = False
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        yield name, sub, []
                    else:
                        plain = True
                        if alias.name.startswith("_") and not alias.name.startswith(
                            "__"
                        ):
                            private.append(alias.name)
                if plain:
                    yield name, target, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function from `def` to its last line, less its docstring's."""
    n = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        n -= (first.end_lineno or first.lineno) - first.lineno + 1
    return n


def python_functions(path: Path, limit: int) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    long = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = function_length(node)
            if n > limit:
                long.append((f"{path.name}:{node.name}", n))
    return long


def measure() -> dict:
    modules = python_files()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[str] = []
    for importer, imported, names in imports(modules):
        if imported in modules and imported != importer:
            edges[importer].add(imported)
        if imported != importer:
            private += [f"{importer} <- {imported}.{n}" for n in names]
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules.items()}
    long_py = [row for p in modules.values() for row in python_functions(p, 60)]
    return {
        "import_cycles": cycles(edges),
        "files_over_500_lines": sorted((m, n) for m, n in sizes.items() if n > 500),
        "private_names_imported_across_files": sorted(private),
        "python_functions_over_60_lines": sorted(long_py),
    }


def main() -> None:
    result = measure()
    if "--json" in sys.argv:
        print(json.dumps(result, indent=1))
        return
    for key, rows in result.items():
        print(f"{key}: {len(rows)}")
        for row in rows:
            print(f"    {row}")


if __name__ == "__main__":
    main()
