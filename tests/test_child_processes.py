"""Every child Python process a test starts runs on the CPU (`child_env`), so that
the suite runs on a machine whose accelerator the pytest process holds."""

import ast
import pathlib

from _child_flags import child_env

TESTS = pathlib.Path(__file__).resolve().parent

# Children that never start JAX, with what they run.
NO_JAX = {
    "test_packaging.py": "python -m build",
    "test_typing.py": "basedpyright",
}


STARTS = ("sys.executable", "NotebookClient")


def _starts(call: ast.Call) -> bool:
    name = ast.unparse(call.func)
    return name.endswith(("subprocess.run", "subprocess.Popen", ".execute"))


def test_every_child_gets_its_environment_from_child_env():
    unpinned = []
    for path in sorted(TESTS.glob("*.py")):
        text = path.read_text()
        if path.name in NO_JAX or not any(s in text for s in STARTS):
            continue
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, ast.FunctionDef):
                continue
            source = ast.unparse(function)
            if not any(s in source for s in STARTS):
                continue
            calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
            for call in filter(_starts, calls):
                if not any(k.arg == "env" for k in call.keywords):
                    unpinned.append(f"{path.name}:{call.lineno} passes no env")
            if "child_env(" not in text:
                unpinned.append(f"{path.name}:{function.lineno} uses no child_env")
    assert unpinned == []


def test_child_env_pins_the_cpu_and_removes_what_is_none(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.setenv("XLA_FLAGS", "--x")
    env = child_env(XLA_FLAGS=None, EXTRA="1")
    assert env["JAX_PLATFORMS"] == "cpu" and env["EXTRA"] == "1"
    assert "XLA_FLAGS" not in env
