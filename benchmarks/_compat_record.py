"""A pytest plugin for `benchmarks/compat.py`: `pytest -p _compat_record` writes one
JSON line per test (node id, outcome, first line of its error) to the file named by
`BOXWOOD_COMPAT_RECORD`, as each test ends, so a run stopped at its deadline or
killed keeps what it reached. With `BOXWOOD_COMPAT_DEADLINE` (seconds), no test
starts after that many seconds from the plugin's import."""

import json
import os
import time

import pytest

_START = time.monotonic()
_DEADLINE = float(os.environ.get("BOXWOOD_COMPAT_DEADLINE") or "inf")
_PATH = os.environ["BOXWOOD_COMPAT_RECORD"]
_OUTCOMES: dict[str, str] = {}
_ERRORS: dict[str, str] = {}


def _first_error_line(report) -> str:
    """The exception's first line (`TypeError: ...`), as pytest's short summary
    gives it."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no message)"


def _write(nodeid: str, outcome: str, error: str = "") -> None:
    line = {"id": nodeid, "outcome": outcome, "error": error}
    line["t"] = round(time.monotonic() - _START, 2)
    with open(_PATH, "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_runtest_logreport(report) -> None:
    # A test's outcome is its worst phase: a failing teardown fails a passed test.
    nodeid = report.nodeid
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    elif report.failed:
        outcome = "failed"
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed"
    if report.failed and nodeid not in _ERRORS:
        _ERRORS[nodeid] = _first_error_line(report)
    previous = _OUTCOMES.get(nodeid)
    if previous not in ("failed", "skipped", "xfailed", "xpassed"):
        _OUTCOMES[nodeid] = outcome
    if report.when == "teardown":
        _write(nodeid, _OUTCOMES.pop(nodeid), _ERRORS.pop(nodeid, ""))


def pytest_collectreport(report) -> None:
    if report.failed:
        _write(report.nodeid or "(collection)", "error", _first_error_line(report))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem) -> None:
    if time.monotonic() - _START > _DEADLINE:
        item.session.shouldstop = "deadline reached (BOXWOOD_COMPAT_DEADLINE)"
