"""What a new user meets: the sdist's contents, the license, the pure-Python notice."""

import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tracked(folder: str) -> set[str]:
    """Files under `folder` that git tracks (or, without git, that exist)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True
        )
        if listed.returncode == 0 and listed.stdout:
            return set(listed.stdout.split())
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
    for name in ("tests/conftest.py", "LICENSE", "NOTICE", "pyproject.toml",
                 "src/boxwood/data/digits.csv.gz", "src/boxwood/_native/_speedups.c"):  # fmt: skip
        assert name in sdist_names
    assert not [n for n in sdist_names if n.endswith((".so", ".pyc"))]


def test_license_is_an_spdx_string_and_the_data_is_credited():
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python >= 3.11)
    assert re.search(r'^license = "Apache-2.0"$', pyproject, re.M)
    assert re.search(r'^license-files = \["LICENSE", "NOTICE"\]$', pyproject, re.M)
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    notice = (ROOT / "NOTICE").read_text()
    assert "CC BY 4.0" in notice and "Alpaydin" in notice


def test_missing_c_extension_gives_one_notice_and_info_says_so(tmp_path):
    # the notice points at the line importing boxwood (here in a library the
    # script imports), not at boxwood's own code
    (tmp_path / "mylib.py").write_text("x = 1\nimport boxwood\n")
    (tmp_path / "main.py").write_text(
        "import sys; sys.modules['boxwood._native._speedups'] = None\n"
        "import mylib, boxwood\n"
        "print(boxwood.info()['path'], boxwood.info()['reason'])\n"
    )
    env = {
        k: v for k, v in __import__("os").environ.items() if k != "BOXWOOD_PURE_PYTHON"
    }
    run = subprocess.run(
        [sys.executable, "-W", "default", str(tmp_path / "main.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "pure Python not built"
    notices = [line for line in run.stderr.splitlines() if "PerformanceWarning" in line]
    assert len(notices) == 1
    assert notices[0].startswith(f"{tmp_path / 'mylib.py'}:2: PerformanceWarning")
    assert "boxwood runs on its pure-Python path" in notices[0]
    assert "about 1.4x" in notices[0]


def test_choosing_the_pure_python_path_is_silent():
    env = dict(__import__("os").environ, BOXWOOD_PURE_PYTHON="1")
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import boxwood; print(boxwood.info())"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert run.returncode == 0 and run.stderr == ""
    assert "'path': 'pure Python', 'reason': 'BOXWOOD_PURE_PYTHON=1'" in run.stdout


def test_info_reports_the_active_path():
    import boxwood
    from boxwood import _native

    info = boxwood.info()
    assert info["speedups"] is _native.active()
    assert info["path"] == ("C extension" if _native.active() else "pure Python")
    assert info["version"] == boxwood.__version__
