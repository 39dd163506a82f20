"""A type checker sees a Module's fields and constructor: basedpyright, run on
tests/module/typing_check/module_fields.py, reports exactly the lines marked there."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ROOT / "tests" / "module" / "typing_check" / "module_fields.py"
_MARK = re.compile(r"#\s*(report\w+)\s*$")


def _expected() -> set:
    lines = CHECKED.read_text(encoding="utf-8").splitlines()
    return {
        (i, m.group(1)) for i, line in enumerate(lines, 1) if (m := _MARK.search(line))
    }


def _reported() -> tuple[set, list]:
    # in the test extra; a machine without it (the TPU run's) skips
    pytest.importorskip("basedpyright")
    # run from the repository root: pyproject.toml's [tool.pyright] applies and
    # `boxwood` resolves to this checkout's src/ (before site-packages)
    result = subprocess.run(
        [sys.executable, "-m", "basedpyright", "--outputjson", str(CHECKED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.stdout, result.stderr  # no JSON: basedpyright did not run
    report = json.loads(result.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    found = {(d["range"]["start"]["line"] + 1, d.get("rule")) for d in errors}
    return found, [d["message"] for d in errors]


def test_the_checker_sees_fields_and_constructors():
    expected = _expected()
    assert len(expected) == 7  # the markers are read (a typo would drop one)
    found, messages = _reported()
    assert found == expected, "\n".join(messages)
    assert 'Argument missing for parameter "weight"' in messages
    assert 'No parameter named "colour"' in messages
