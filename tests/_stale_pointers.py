"""Pointers in boxwood's comments, docstrings and READMEs that name a file or a
name that does not exist, for tests/house/test_architecture.py.

A pointer is a backticked file name (`_flat_key.py`, `boxwood/_jit/_cache.py`),
which must be the end of some file's path in the project, or a backticked dotted
name starting with one of boxwood's private modules (`_module._Field`), which must
import and resolve from the pointing file's package or one of its parents.
"""

from __future__ import annotations

import importlib
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
_FILE = re.compile(r"`([\w./-]*\w\.(?:py|c|md|ipynb))`")
_DOTTED = re.compile(r"`(_\w+(?:\.\w+)+)`")
_EXTENSIONS = (".py", ".md", ".c", ".ipynb")
_TREES = ("src/**/*", "tests/**/*", "benchmarks/**/*", "docs/**/*", "notebooks/*")


def _resolves(dotted: str, package: str, modules: set[str]) -> bool:
    parts = dotted.split(".")
    if parts[0] not in modules:
        return True  # not a pointer into boxwood
    bases = [package.rsplit(".", k)[0] for k in range(package.count(".") + 1)]
    for base in bases:
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(base + "." + ".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                break
            return True
    return False


def stale_pointers(root: pathlib.Path = ROOT) -> list[str]:
    """`file:line: pointer` for each pointer of `root/src/boxwood` that names
    nothing."""
    src = root / "src"
    paths = {
        str(p.relative_to(root)) for g in ("*", ".ci/*", *_TREES) for p in root.glob(g)
    }
    modules = {p.stem for p in src.glob("boxwood/**/*.py")}
    modules |= {p.name for p in src.glob("boxwood/**") if p.is_dir()}
    found = []
    for file in sorted(src.glob("boxwood/**/*")):
        if file.suffix not in (".py", ".md", ".c"):
            continue
        package = ".".join(file.relative_to(src).with_suffix("").parts[:-1])
        for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{file.relative_to(root)}:{n}"
            for m in _FILE.finditer(line):
                if not any(p.endswith(m[1]) for p in paths):
                    found.append(f"{where}: {m[1]}")
            for m in _DOTTED.finditer(line):
                if not m[1].endswith(_EXTENSIONS) and not _resolves(
                    m[1], package, modules
                ):
                    found.append(f"{where}: {m[1]}")
    return found
