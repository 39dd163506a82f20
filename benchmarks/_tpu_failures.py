"""A pytest plugin for benchmarks/tpu_run.sh: each test's start, and each failure's
report, are appended to the file `$TPU_RUN_FAILURES` (flushed) as they happen.
pytest prints tracebacks only at the end of a run, so a run stopped at the
machine's time limit would otherwise keep none.

With `$TPU_RUN_TEST_LIMIT` (seconds, > 0), a test still running after that long
is taken as hung (a call into the runtime that never returns ignores SIGINT): the
file gets `HUNG <nodeid>` and every thread's stack, and the process exits with
`HUNG_EXIT`, so that tpu_run.sh can start pytest again without the tests that
already ran."""

import faulthandler
import os
import threading

HUNG_EXIT = 75
_watch: list[threading.Timer] = []


def _write(text: str) -> None:
    with open(os.environ["TPU_RUN_FAILURES"], "a") as f:
        f.write(text)


def _hung(nodeid: str, limit: float) -> None:
    with open(os.environ["TPU_RUN_FAILURES"], "a") as f:
        f.write(f"HUNG {nodeid} (still running after {limit:.0f} s)\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)
        f.write("\n")
    os._exit(HUNG_EXIT)


def pytest_runtest_logstart(nodeid, location):
    _write(f"started {nodeid}\n")
    limit = float(os.environ.get("TPU_RUN_TEST_LIMIT", "0") or 0)
    if limit > 0:
        timer = threading.Timer(limit, _hung, (nodeid, limit))
        timer.daemon = True
        timer.start()
        _watch.append(timer)


def pytest_runtest_logfinish(nodeid, location):
    while _watch:
        _watch.pop().cancel()


def pytest_runtest_logreport(report):
    if report.failed:
        _write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
