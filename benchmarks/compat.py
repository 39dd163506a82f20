"""Libraries built on Equinox, their own test suites run unchanged on the real Equinox
and on boxwood: which tests pass on one and fail on the other, and each side's time.

    python benchmarks/compat.py [--libs flowjax,paramax,...] [--sample N]
                                [--deadline SECONDS] [--timeout SECONDS]
                                [--parallel] [--tests-from NAME=DIR ...]
                                [--pytest-args "-k ..."] [--cache build/compat]
                                [--src SRC] [--out FILE.md] [--fetch]

For each library, its test suite comes from its source distribution on PyPI
(`pip download --no-deps --no-binary :all:`, unpacked under `--cache`), or from a
checkout (`--tests-from NAME=DIR`) for the libraries whose sdist ships no tests. The
suite runs with pytest, in its own folder (so its own pytest settings apply: the
jaxtyping import hook, warnings as errors), in two fresh processes one after the
other (or both at once, `--parallel`): one with the installed Equinox, one with
`equinox` pointed at boxwood by the plugin `_compat_alias.py` (loaded with `-p`,
before any conftest). The plugin
`_compat_record.py` writes each test's outcome and first error line as it ends.

The report gives, per library, each side's passed/failed/skipped counts and wall
time (and the load average before each side), then the tests that pass on Equinox
and fail on boxwood, and the reverse, grouped by their first error line. Only tests
that ran on both sides are compared.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _compat_suites import LIBRARIES, Library, installed_version, sdist_root  # noqa: E402

SIDES = ("equinox", "boxwood")
PASSING = ("passed", "xfailed", "skipped")
_LIVE: list[subprocess.Popen] = []  # the pytest children, ended on SIGTERM


def child_env(side: str, src: Path, record: Path, deadline: float | None) -> dict:
    """The environment of one side's pytest process: this folder (the plugins) and
    boxwood's `src` on `PYTHONPATH`, on the CPU, no inherited pytest options."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(src)])
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    env["BOXWOOD_COMPAT_RECORD"] = str(record)
    env["BOXWOOD_COMPAT_DEADLINE"] = "" if deadline is None else str(deadline)
    return env


def pytest_command(side: str, targets: list[str], extra: list[str]) -> list[str]:
    alias = ["-p", "_compat_alias"] if side == "boxwood" else []
    return [
        sys.executable, "-m", "pytest", "-p", "_compat_record", *alias,
        "-q", "-p", "no:cacheprovider", "--no-header", "-rN", *targets, *extra,
    ]  # fmt: skip


class Side:
    """One side's pytest process, started at once; `result()` waits for it and
    returns each test's outcome and error line, the wall time and the load average
    before and after."""

    def __init__(self, side: str, root: Path, targets: list[str], opts):
        self.side, self.timeout = side, opts.timeout
        self.tmp = tempfile.TemporaryDirectory()
        self.record = Path(self.tmp.name) / "record.jsonl"
        self.load = os.getloadavg()
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(
            pytest_command(side, targets, opts.extra),
            cwd=root,
            env=child_env(side, opts.src, self.record, opts.deadline),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        _LIVE.append(self.proc)

    def result(self) -> dict:
        try:
            output, _ = self.proc.communicate(timeout=self.timeout)
            code, tail = self.proc.returncode, output[-2000:]
        except subprocess.TimeoutExpired:
            code, tail = None, f"killed after --timeout {self.timeout} s"
        finally:  # also when this process is stopped (SIGTERM, Ctrl-C)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        wall = time.perf_counter() - self.start
        record = self.record
        lines = record.read_text().splitlines() if record.exists() else []
        self.tmp.cleanup()
        return _result(self.side, lines, wall, self.load, code, tail)


def _result(side, lines, wall, load, code, tail) -> dict:
    tests, ends = {}, {}
    for line in lines:
        entry = json.loads(line)
        tests[entry["id"]] = (entry["outcome"], entry["error"])
        ends[entry["id"]] = entry["t"]
    return {
        "side": side,
        "tests": tests,
        "ends": ends,  # seconds from the process's start to each test's end
        "wall_s": round(wall, 1),
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "returncode": code,
        "tail": tail,
    }


def collect(root: Path, targets: list[str], opts) -> list[str]:
    """The suite's test ids (collected on the real Equinox)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env("equinox", opts.src, Path(tmp) / "r.jsonl", None)
        proc = subprocess.run(
            pytest_command("equinox", targets, [*opts.extra, "--collect-only"]),
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
    return [ln for ln in proc.stdout.splitlines() if "::" in ln]


def evenly(ids: list[str], n: int) -> list[str]:
    """`n` of `ids`, spread evenly over the suite (deterministic)."""
    if n >= len(ids):
        return ids
    return [ids[(i * len(ids)) // n] for i in range(n)]


def outcome_of(side: dict, test_id: str) -> tuple[str, str] | None:
    """A test's outcome on one side; a test missing because its file failed to
    import counts as failed with that error."""
    if test_id in side["tests"]:
        return side["tests"][test_id]
    for node, (outcome, error) in side["tests"].items():
        if outcome == "error" and test_id.startswith(node.split("::")[0]):
            return ("error", error)
    return None


def compare(runs: dict[str, dict]) -> dict:
    """Tests passing on one side and failing on the other, grouped by the failing
    side's first error line."""
    eq, bw = runs["equinox"], runs["boxwood"]
    ids = [t for t in eq["tests"] if "::" in t] + [
        t for t in bw["tests"] if "::" in t and t not in eq["tests"]
    ]
    only = {"equinox": collections.defaultdict(list)}
    only["boxwood"] = collections.defaultdict(list)
    both, last = 0, ""
    for test_id in ids:
        a, b = outcome_of(eq, test_id), outcome_of(bw, test_id)
        if a is None or b is None:
            continue
        both += 1
        last = max(last, test_id, key=lambda t: eq["ends"].get(t, -1.0))
        if a[0] in PASSING and b[0] not in PASSING:
            only["equinox"][b[1]].append(test_id)
        elif b[0] in PASSING and a[0] not in PASSING:
            only["boxwood"][a[1]].append(test_id)
    # Each side's time to the end of the last test both ran (in Equinox's order):
    # with a deadline, the wall times alone are equal by construction.
    upto = {s: runs[s]["ends"].get(last) for s in SIDES}
    return {
        "compared": both,
        "time_to_common_s": upto,
        "pass_only_on": {k: dict(v) for k, v in only.items()},
    }


def counts(run: dict) -> dict:
    c = collections.Counter(o for t, (o, _) in run["tests"].items() if "::" in t)
    c["collection errors"] = sum(
        1 for t, (o, _) in run["tests"].items() if o == "error" and "::" not in t
    )
    return dict(c)


def run_library(lib: Library, opts) -> dict:
    version = installed_version(lib.name)
    row = {"library": lib.name, "version": lib.version, "installed": version}
    if version != lib.version:
        row["skipped"] = f"installed {lib.name} is {version}, not {lib.version}"
        return row
    if lib.name in opts.tests_from:
        root = Path(opts.tests_from[lib.name]).resolve()
        row["tests_from"] = str(root)
    elif lib.in_sdist:
        root = sdist_root(lib, opts.cache)
        row["tests_from"] = f"sdist {lib.name}-{lib.version}"
    else:
        row["skipped"] = (
            f"the sdist of {lib.name} {lib.version} ships no tests: "
            f"pass --tests-from {lib.name}=DIR (a checkout of that version)"
        )
        return row
    targets = [lib.tests]
    if opts.sample:
        ids = collect(root, targets, opts)
        chosen = evenly(ids, opts.sample)
        row["sampled"] = f"{len(chosen)} of {len(ids)}"
        listing = opts.cache / f"{lib.name}-sample.txt"
        listing.write_text("\n".join(chosen) + "\n")
        targets = [f"@{listing.resolve()}"]
    order = SIDES if not opts.boxwood_first else SIDES[::-1]
    runs = {}
    if opts.parallel:
        print(f"{lib.name}: both sides at once ...", file=sys.stderr, flush=True)
        started = [Side(side, root, targets, opts) for side in order]
        # A thread waits on each, so each side's wall time ends with its process.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs = {r["side"]: r for r in pool.map(Side.result, started)}
    for side in order if not opts.parallel else ():
        print(f"{lib.name}: {side} ...", file=sys.stderr, flush=True)
        runs[side] = Side(side, root, targets, opts).result()
    for side in order:
        print(f"  {side}: {counts(runs[side])} in {runs[side]['wall_s']} s",
              file=sys.stderr, flush=True)  # fmt: skip
    row["runs"] = runs
    row.update(compare(runs))
    return row


def _fmt_s(s: float) -> str:
    return f"{int(s // 60)} min {s % 60:.0f} s" if s >= 60 else f"{s:.0f} s"


def report(rows: list[dict], opts) -> str:
    out = [
        f"# Libraries built on Equinox, on Equinox and on boxwood ({opts.date})",
        "",
        f"- Command: `python benchmarks/compat.py {' '.join(opts.argv)}`",
        f"- Machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}; "
        + ", ".join(f"{n} {installed_version(n)}" for n in ("jax", "equinox")),
        f"- boxwood: `{opts.src}`",
        "- Load average (1, 5, 15 min) before each side is in the table.",
        "",
        "| library | tests | side | passed | failed | skipped | other | wall | load before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "skipped" in row:
            out.append(
                f"| {row['library']} {row['version']} | not run: {row['skipped']} |||||||"
            )
            continue
        where = row["tests_from"] + (f", {row['sampled']}" if "sampled" in row else "")
        for side, run in row["runs"].items():
            c = counts(run)
            other = {
                k: v
                for k, v in c.items()
                if k not in ("passed", "failed", "skipped") and v
            }
            out.append(
                f"| {row['library']} {row['version']} | {where} | {side} | "
                f"{c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('skipped', 0)} | "
                f"{', '.join(f'{k} {v}' for k, v in other.items()) or '-'} | "
                f"{_fmt_s(run['wall_s'])} | {run['load_before']} |"
            )
    for row in rows:
        if "runs" not in row:
            continue
        out += ["", f"## {row['library']} {row['version']}", ""]
        eq, bw = row["runs"]["equinox"]["wall_s"], row["runs"]["boxwood"]["wall_s"]
        out.append(
            f"{row['compared']} tests ran on both sides. Wall time: Equinox "
            f"{_fmt_s(eq)}, boxwood {_fmt_s(bw)} (boxwood / Equinox {bw / eq:.2f})."
        )
        upto = row["time_to_common_s"]
        if None not in upto.values() and upto["equinox"]:
            out[-1] += (
                f" To the end of the last test both ran: Equinox "
                f"{_fmt_s(upto['equinox'])}, boxwood {_fmt_s(upto['boxwood'])} "
                f"({upto['boxwood'] / upto['equinox']:.2f})."
            )
        for side, other in (("equinox", "boxwood"), ("boxwood", "equinox")):
            groups = row["pass_only_on"][side]
            n = sum(len(v) for v in groups.values())
            out += ["", f"Pass on {side}, fail on {other}: {n}", ""]
            for error, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                out.append(f"- `{error}` ({len(ids)}):")
                out += [f"  - `{t}`" for t in ids[: opts.list_max]]
                if len(ids) > opts.list_max:
                    out.append(f"  - ... and {len(ids) - opts.list_max} more")
    return "\n".join(out) + "\n"


def parse(argv: list[str]):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libs", default="flowjax,paramax,interpax,quax")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds per side after which no test starts")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per side after which pytest is killed")  # fmt: skip
    parser.add_argument("--sample", type=int, default=0,
                        help="run N tests spread evenly over the suite")  # fmt: skip
    parser.add_argument("--tests-from", action="append", default=[],
                        metavar="NAME=DIR", help="a checkout holding NAME's tests")  # fmt: skip
    parser.add_argument("--pytest-args", default="", help="more pytest arguments")
    parser.add_argument("--boxwood-first", action="store_true")
    parser.add_argument("--parallel", action="store_true",
                        help="run the two sides at the same time")  # fmt: skip
    parser.add_argument("--cache", default=str(HERE.parent / "build" / "compat"))
    parser.add_argument("--src", default=str(HERE.parent / "src"))
    parser.add_argument("--list-max", type=int, default=40)
    parser.add_argument("--out", default="", help="write the report (and .json)")
    parser.add_argument("--fetch", action="store_true",
                        help="only download and unpack the sdists into --cache")  # fmt: skip
    opts = parser.parse_args(argv)
    opts.argv = argv
    opts.extra = shlex.split(opts.pytest_args)
    opts.tests_from = dict(kv.split("=", 1) for kv in opts.tests_from)
    opts.cache = Path(opts.cache).resolve()
    opts.cache.mkdir(parents=True, exist_ok=True)
    opts.src = Path(opts.src).resolve()
    opts.date = datetime.date.today().isoformat()
    return opts


def _stop(*_) -> None:
    """On SIGTERM (`timeout`, `kill`): end the pytest children, then exit."""
    for proc in _LIVE:
        if proc.poll() is None:
            proc.kill()
    sys.exit(143)


def main(argv: list[str]) -> None:
    opts = parse(argv)
    signal.signal(signal.SIGTERM, _stop)
    unknown = [n for n in opts.libs.split(",") if n not in LIBRARIES]
    if unknown:
        raise SystemExit(f"--libs: unknown {unknown}; known: {sorted(LIBRARIES)}")
    if opts.fetch:
        for name in opts.libs.split(","):
            if LIBRARIES[name].in_sdist:
                print(sdist_root(LIBRARIES[name], opts.cache))
        return
    rows = [run_library(LIBRARIES[n], opts) for n in opts.libs.split(",")]
    text = report(rows, opts)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text)
        Path(opts.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
