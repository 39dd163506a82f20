"""A pytest plugin for benchmarks/tpu_run.sh: each failure's report is appended to
the file `$TPU_RUN_FAILURES` when it happens, and each test's start is written
(and flushed) before it runs. pytest prints tracebacks only at the end of a run,
so a run stopped at the machine's time limit (or by a test that hangs) would
otherwise keep none; this file keeps what came before, and its last line names
the test that was running."""

import os


def _write(text: str) -> None:
    with open(os.environ["TPU_RUN_FAILURES"], "a") as f:
        f.write(text)


def pytest_runtest_logstart(nodeid, location):
    _write(f"started {nodeid}\n")


def pytest_runtest_logreport(report):
    if report.failed:
        _write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
