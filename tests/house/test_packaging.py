"""What a new user meets: the sdist's contents, a pure-Python wheel, the license."""

import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tracked(folder: str) -> set[str]:
    """Files under `folder` that git tracks (or, without git, that exist)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True
        )
        if listed.returncode == 0 and listed.stdout:  # (not those deleted since)
            return {n for n in listed.stdout.split() if (ROOT / n).exists()}
    return {
        str(p.relative_to(ROOT))
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory):
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (archive,) = out.glob("boxwood-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    prefix = names[0].split("/")[0] + "/"
    return {n[len(prefix) :] for n in names if n.startswith(prefix)}


def test_sdist_carries_tests_notebooks_docs_and_license(sdist_names):
    for folder in ("tests", "notebooks", "docs", "src/boxwood"):
        missing = _tracked(folder) - sdist_names
        assert not missing, f"the sdist lacks {sorted(missing)}"
    for name in (
        "tests/conftest.py",
        "LICENSE",
        "NOTICE",
        "pyproject.toml",
        "src/boxwood/data/digits.csv.gz",
        "src/boxwood/data/python_reference.txt.gz",
    ):
        assert name in sdist_names
    assert not [n for n in sdist_names if n.endswith((".so", ".pyc"))]


def test_license_is_an_spdx_string_and_the_data_is_credited():
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python >= 3.11)
    assert re.search(r'^license = "Apache-2.0"$', pyproject, re.M)
    assert re.search(r'^license-files = \["LICENSE", "NOTICE"\]$', pyproject, re.M)
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    notice = (ROOT / "NOTICE").read_text()
    assert "CC BY 4.0" in notice and "Alpaydin" in notice
    assert "Python Software Foundation License" in notice
    # the API's origin is named, and the implementation said to be boxwood's own
    assert "follows" in notice and "Equinox" in notice
    assert "contains no Equinox code" in notice


def test_the_wheel_is_pure_python(tmp_path):
    pytest.importorskip("build")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
         str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("boxwood-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "boxwood/_jit/_wrapper.py" in names
    assert not [n for n in names if n.endswith((".so", ".pyd", ".c"))]


def test_info_reports_the_versions():
    import jax

    import boxwood

    assert boxwood.info() == {"version": boxwood.__version__, "jax": jax.__version__}
