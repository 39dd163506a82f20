import pathlib
import re

import jax

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_example_runs_and_compiles_once(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counts and floats
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "CacheInfo(hits=99, misses=1, traces=1, size=1)" in out


def test_readme_gives_exactly_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert len(commands) == 2
    assert "python -m boxwood.demo" in commands[0]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
