"""Libraries built on Equinox run their own tests on boxwood: a few tests of each
(flowjax's flows and bijections among them), unchanged, from the library's source
distribution on PyPI, with `equinox` pointed at boxwood.

The whole suites, on boxwood and on the real Equinox side by side, are
`benchmarks/compat.py`'s; this is its fast subset. One child process (so that the
alias reaches no other test) installs the alias (`benchmarks/_compat_alias.py`), then
runs each library's selection with pytest in the library's own folder, under its own
pytest settings (the jaxtyping import hook with beartype); `_compat_record.py`
records each test's outcome, and the test checks that each passed.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _child_flags import child_env

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
CACHE = ROOT / "build" / "compat"

# Each library's tests, chosen cheap and covering what boxwood must do for it:
# paramax's wrappers, unwrapped inside flowjax's bijections by the method wrappers
# flowjax's `__init_subclass__` installs (the two flowjax tests fail without them),
# a flow built and sampled, an interpax interpolator (a Module with static fields),
# quax's own construction path.
# The child takes about 20 s of CPU time, half of it importing flowjax under the
# jaxtyping hook; each of interpax's parametrised interpolation tests takes more.
SELECTION = {
    "interpax": ["tests/test_interpolate.py::test_extrap_float"],
    "paramax": [
        "tests/test_wrappers.py::test_Parameterize",
        "tests/test_wrappers.py::test_nested_unwrap",
        "tests/test_wrappers.py::test_WeightNormalization",
    ],
    "flowjax": [
        "tests/test_flows.py::test_flow_sample[None-affine_coupling]",
        "tests/test_bijections/test_bijections.py::test_transform_inverse[Affine]",
    ],
    # quax's fast construction: Equinox's private `_currently_initialising` and
    # `is_abstract_module`, and a metaclass `__call__` of its own
    "quax": [
        "tests/unit/test_fast_module.py::test_fast_path_available",
        "tests/unit/test_fast_module.py::test_fast_path_actually_bypasses_equinox_slow_call",
        "tests/unit/test_fast_module.py::test_static_field_and_pytree_roundtrip",
        "tests/unit/test_fast_module.py::test_converter_is_applied",
    ],
}


def _suites():
    spec = importlib.util.spec_from_file_location(
        "_compat_suites", BENCHMARKS / "_compat_suites.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


_CHILD = textwrap.dedent(
    r"""
    import json, os, sys, time

    import _compat_alias  # `equinox` is boxwood from here on
    import pytest

    # pytest warns that plugins imported before it starts (jaxtyping's, imported by
    # boxwood) cannot have their asserts rewritten; a library whose settings turn
    # warnings into errors (interpax) would stop at that.
    quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    for root, tests in json.loads(sys.argv[1]):
        os.chdir(root)
        pytest.main(["-p", "_compat_record", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark", *quiet, *tests])
        print(f"CPU {time.process_time():.1f} s after {os.path.basename(root)}")
        # Another library's test files may have the same names (tests/test_utils.py).
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(root + "/tests"):
                del sys.modules[name]
    """
)


def _run_selection(tmp_path: Path) -> tuple[dict, str]:
    """Each selected test's outcome and first error line, from one child run."""
    suites = _suites()
    plan = []
    for name, tests in SELECTION.items():
        lib = suites.LIBRARIES[name]
        installed = suites.installed_version(name)  # read without importing it
        if installed is None:  # the `test` extra installs them, pinned
            pytest.skip(f"{name} is not installed")
        assert installed == lib.version, (
            f"{name} {installed} is installed; these tests are {name} "
            f"{lib.version}'s: `pip install {name}=={lib.version}`"
        )
        plan.append((str(suites.sdist_root(lib, CACHE)), tests))
    record = tmp_path / "record.jsonl"
    env = child_env(
        PYTHONPATH=os.pathsep.join([str(BENCHMARKS), str(ROOT / "src"), *sys.path]),
        PYTEST_ADDOPTS=None,
        BOXWOOD_COMPAT_RECORD=str(record),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(plan)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    found = {}
    for line in record.read_text().splitlines() if record.exists() else []:
        entry = json.loads(line)
        found[entry["id"]] = (entry["outcome"], entry["error"])
    return found, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_libraries_own_tests_pass_on_boxwood(tmp_path):
    # One test, one child process: under `pytest -n 2` a parametrised test's cases
    # could go to both workers, and each would start the child.
    found, output = _run_selection(tmp_path)
    wrong = [
        f"{lib}: {test}: " + (" ".join(found[test]) if test in found else "did not run")
        for lib, tests in SELECTION.items()
        for test in tests
        if found.get(test, ("",))[0] != "passed"
    ]
    assert not wrong, "\n".join(wrong) + f"\n\nthe child's output:\n{output}"
