"""The libraries of `benchmarks/compat.py` and where their test suites come from:
each library's source distribution on PyPI (`pip download`), unpacked into a cache
folder, its tests unchanged. tests/ecosystem/test_ecosystem_libraries.py uses the same
functions."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import subprocess
import sys
import tarfile
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Library:
    """A library built on Equinox and its test suite.

    **Arguments:**

    - `name`: the distribution's name on PyPI.
    - `version`: the version whose sdist's tests run (the installed one must match).
    - `tests`: the test folder inside the sdist (or inside `--tests-from DIR`).
    - `in_sdist`: whether the sdist ships its tests; lineax, optimistix and diffrax
      build theirs without, so their suites come from a checkout
      (`--tests-from NAME=DIR`).
    """

    name: str
    version: str
    tests: str = "tests"
    in_sdist: bool = True


LIBRARIES = {
    lib.name: lib
    for lib in (
        Library("flowjax", "19.1.2"),
        Library("paramax", "0.0.5"),
        Library("interpax", "0.3.16"),
        Library("quax", "0.4.6"),
        Library("lineax", "0.1.1", in_sdist=False),
        Library("optimistix", "0.1.0", in_sdist=False),
        Library("diffrax", "0.7.2", tests="test", in_sdist=False),
    )
}


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sdist_root(lib: Library, cache: Path) -> Path:
    """The unpacked sdist of `lib` under `cache` (downloaded with pip the first
    time; the archive and the folder are kept for the next run)."""
    root = cache / "src" / f"{lib.name}-{lib.version}"
    if (root / "pyproject.toml").exists() or (root / "setup.py").exists():
        return root
    archives = cache / "sdists"
    archive = _archive(lib, archives)
    if archive is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--no-binary", ":all:", "--dest", str(archives)]
            + [f"{lib.name}=={lib.version}"],
            check=True,
            capture_output=True,
        )
        archive = _archive(lib, archives)
    if archive is None:
        raise RuntimeError(f"pip downloaded no sdist of {lib.name}=={lib.version}")
    root.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(root.parent, filter="data")
    if top != root.name:
        (root.parent / top).rename(root)
    return root


def _archive(lib: Library, folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    stem = lib.name.replace("-", "_")
    for prefix in {lib.name, stem}:
        found = sorted(folder.glob(f"{prefix}-{lib.version}.tar.gz"))
        if found:
            return found[0]
    return None
