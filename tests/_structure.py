"""The structure of `src/boxwood`, for tests/house/test_architecture.py: arrows between
packages, private names used across packages, modules patched at import time, and
the file lists of the package READMEs.

A *package* is a folder under `src/boxwood` (`_jit`, `_jit/_capture`, `nn`, ...) or,
for the files directly in `src/boxwood` (`_tree.py`, `_filters.py`, ...), the
file itself: each of those is a floor of its own. Its *group* is its first part
under `boxwood` (`_jit/_capture` is in the group `_jit`).

- `package_cycles`: cycles between groups, counting every import (at module
  level, in functions, under `TYPE_CHECKING`), except those of `boxwood/__init__.py`
  (the public API imports every group) and of `__init__.py` re-exports within a
  group. A cycle means some arrow points up: a group imports one that imports it.
- `private_uses`: a private name (starting with one `_`) of a boxwood module used
  in another package, imported (`from .._tree import _Probe`) or read as an
  attribute of an imported module (`_cache._STORES`, `_jit._cache._STORES`).
  Module names themselves are counted by `private_module_imports`, not here.
- `private_module_imports`: a module of another group imported past that group's
  `__init__.py` (`from .._module._register import MODULE_TYPES`, `from .._module
  import _flat_form`, `import boxwood.nn._state`): what a group offers the others
  is in its `__init__.py`. A subpackage may use its group's files (`_jit/_capture/`
  imports `_jit/_explain.py`), and a file directly in `boxwood` is its own
  interface.
- `import_time_patches`: a statement at module level (outside functions and
  classes) that sets an attribute on something imported from another boxwood
  module: `_core.bind_method = ...`, `type.__setattr__(Module, ...)`,
  `setattr(other_module, ...)`.
- `repeated_file_names`: a file name (other than `__init__.py`) that two files of
  `src/boxwood` share: one name, one meaning.
- `readme_mismatches`: for each package README, the files of the package it does
  not name (as `` `name.py` `` or a path ending so; `__init__.py`, the package's
  interface, need not be named) and the backticked bare `.py` names it gives that
  are no file of the package or its subfolders (another package's file is named
  by its path, `_jit/_cache.py`).
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _module_name(path: pathlib.Path, src: pathlib.Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules(src: pathlib.Path) -> dict[str, pathlib.Path]:
    return {_module_name(p, src): p for p in sorted((src / "boxwood").rglob("*.py"))}


def _package(module: str, modules: dict[str, pathlib.Path]) -> str:
    """The folder of `module` as a dotted name, or the module itself for a file
    directly in `boxwood`."""
    path = modules[module]
    if path.name == "__init__.py":
        return module
    parent = module.rsplit(".", 1)[0]
    return module if parent == "boxwood" else parent


def _group(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


class _File:
    """One module's imports: the modules it imports (`edges`), the names bound to
    boxwood modules (`aliases`), and the private names it imports from another
    module (`private`, as `(line, module, name)`)."""

    def __init__(self, module: str, path: pathlib.Path, modules: dict) -> None:
        self.module, self.path = module, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        self.edges: set[str] = set()
        self.aliases: dict[str, str] = {}
        self.private: list[tuple[int, str, str]] = []
        is_package = path.name == "__init__.py"
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "boxwood" and alias.name in modules:
                        self.edges.add(alias.name)
                        if alias.asname:
                            self.aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, is_package, node)
                if target.split(".")[0] != "boxwood":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        self.edges.add(sub)
                        self.aliases[alias.asname or alias.name] = sub
                    else:
                        if target in modules:
                            self.edges.add(target)
                        if _is_private(alias.name):
                            self.private.append((node.lineno, target, alias.name))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache  # one parse of the tree per test run
def _files(src: pathlib.Path) -> tuple[dict[str, pathlib.Path], list[_File]]:
    modules = _modules(src)
    return modules, [_File(m, p, modules) for m, p in modules.items()]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_cycles(src: pathlib.Path = SRC) -> list[list[str]]:
    """Cycles between the groups of `src/boxwood` (see the module docstring)."""
    _, files = _files(src)
    edges: dict[str, set[str]] = {}
    for f in files:
        if f.module == "boxwood":
            continue
        source = _group(f.module)
        for target in f.edges:
            if target != "boxwood" and _group(target) != source:
                edges.setdefault(source, set()).add(_group(target))
    return _cycles(edges)


def private_uses(src: pathlib.Path = SRC) -> list[str]:
    """`importer: module.name` for each private name used across packages."""
    modules, files = _files(src)
    found = set()
    for f in files:
        here = _package(f.module, modules)
        for _, target, name in f.private:
            if target in modules and _package(target, modules) != here:
                found.add(f"{f.module}: {target}.{name}")
        for node in ast.walk(f.tree):
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
                continue
            owner = _dotted_module(node.value, f.aliases, modules)
            if owner is None or f"{owner}.{node.attr}" in modules:
                continue
            if _package(owner, modules) != here:
                found.add(f"{f.module}: {owner}.{node.attr}")
    return sorted(found)


def private_module_imports(src: pathlib.Path = SRC) -> list[str]:
    """`importer: module` for each module of another group imported past that
    group's `__init__.py` (see the module docstring)."""
    _, files = _files(src)
    found = set()
    for f in files:
        here = _group(f.module)
        for target in f.edges:
            group = _group(target)
            if group != here and target != group:
                found.add(f"{f.module}: {target}")
    return sorted(found)


def _dotted_module(node: ast.expr, aliases: dict, modules: dict) -> str | None:
    """The boxwood module an expression such as `_jit._cache` names, or `None`."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _dotted_module(node.value, aliases, modules)
        if owner is not None and f"{owner}.{node.attr}" in modules:
            return f"{owner}.{node.attr}"
    return None


def _imported_names(f: _File) -> set[str]:
    """Names bound at `f`'s module level to a boxwood module or to a name imported
    from one."""
    names = set(f.aliases)
    for node in f.tree.body:
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").split(".")[0] == "boxwood"
        ):
            names |= {a.asname or a.name for a in node.names}
    return names


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def import_time_patches(src: pathlib.Path = SRC) -> list[str]:
    """`file:line` for each module-level statement that sets an attribute on
    something imported from another boxwood module."""
    _, files = _files(src)
    found = []
    for f in files:
        imported = _imported_names(f)
        for node in f.tree.body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                targets = [t for t in targets if isinstance(t, ast.Attribute)]
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                call = node.value
                name = ast.unparse(call.func)
                if name in ("setattr", "type.__setattr__", "object.__setattr__"):
                    targets = call.args[:1]
            if any(_root_name(t) in imported for t in targets):
                where = f.path.relative_to(src.parent)
                found.append(f"{where}:{node.lineno}")
    return found


_NAMED = re.compile(r"`([\w./-]*\.py)`")


def readme_mismatches(src: pathlib.Path = SRC) -> dict[str, list[str]]:
    """For each package folder of `src/boxwood` (a folder with `__init__.py`): the
    README's problems, `missing README`, `not listed: x.py` or `no such file: x.py`.
    A subfolder with its own README is listed by the parent as `folder/`."""
    found: dict[str, list[str]] = {}
    for init in sorted((src / "boxwood").rglob("__init__.py")):
        folder = init.parent
        where = str(folder.relative_to(src))
        readme = folder / "README.md"
        if not readme.exists():
            found[where] = ["missing README"]
            continue
        text = readme.read_text(encoding="utf-8")
        named = set(_NAMED.findall(text))
        problems = []
        own = sorted(p.name for p in folder.glob("*.py"))
        for name in own:
            if name == "__init__.py":
                continue
            if not any(n == name or n.endswith(f"/{where}/{name}") for n in named):
                problems.append(f"not listed: {name}")
        for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").exists()):
            if f"`{sub.name}/`" not in text:
                problems.append(f"not listed: {sub.name}/")
        for name in sorted(named):
            if "/" not in name and name not in own and _looks_local(name, folder):
                problems.append(f"no such file: {name}")
        if problems:
            found[where] = problems
    return found


def _looks_local(name: str, folder: pathlib.Path) -> bool:
    """A bare file name in a package README names a file of the package or of its
    subfolders (another package's file is named by its path: `_jit/_cache.py`)."""
    return not any(p.name == name for p in folder.rglob("*.py"))


def repeated_file_names(src: pathlib.Path = SRC) -> dict[str, list[str]]:
    """`{file name: its paths under src/boxwood}` for each name (other than
    `__init__.py`) that more than one Python file has."""
    found: dict[str, list[str]] = {}
    for path in sorted((src / "boxwood").rglob("*.py")):
        if path.name != "__init__.py":
            where = path.relative_to(src / "boxwood").as_posix()
            found.setdefault(path.name, []).append(where)
    return {name: paths for name, paths in found.items() if len(paths) > 1}
