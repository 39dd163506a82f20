"""Re-running the same notebook cell does not warn that a loop keeps wrapping new
functions, while a loop (in a cell, a script or a function called again) still
does. ipykernel names a cell's file by a hash of its text, so each run of a cell
is the same file and line to `_jit/_cache.py`'s `_note_wrap`; but each run
compiles the cell again (IPython compiles every cell it runs), so the code object
running the line is a new one, and the count starts again."""

import warnings

import pytest

import boxwood as bw
from boxwood._jit import _cache

CELL = "@bw.filter_jit\ndef forward(x):\n    return x\n"
LOOP_CELL = "for _ in range(6):\n    step = bw.filter_jit(lambda x: x + 1)\n"
FILE = "/tmp/ipykernel_4242/3263827563.py"  # as ipykernel names a cell's file


@pytest.fixture(autouse=True)
def _fresh_wrap_sites(monkeypatch):
    monkeypatch.setattr(_cache, "_WRAPS_AT_SITE", type(_cache._WRAPS_AT_SITE)())


def _churn(caught):
    return [w for w in caught if issubclass(w.category, bw.PerformanceWarning)]


def test_rerunning_a_cell_does_not_warn_about_a_loop():
    namespace = {"bw": bw}
    with warnings.catch_warnings():
        warnings.simplefilter("error", bw.PerformanceWarning)
        for _ in range(8):
            exec(compile(CELL, FILE, "exec"), namespace)  # a run compiles the cell


def test_a_loop_inside_a_cell_still_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(LOOP_CELL, FILE, "exec"), {"bw": bw})
    assert len(_churn(caught)) == 1
    assert "wrapped 5 different function objects" in str(_churn(caught)[0].message)


def test_a_function_called_again_and_again_still_warns_once():
    def make():
        return bw.filter_jit(lambda x: x * 2)  # same code object on every call

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrappers = [make() for _ in range(6)]
    assert len(wrappers) == 6 and len(_churn(caught)) == 1
