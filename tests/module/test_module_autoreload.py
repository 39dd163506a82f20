"""IPython's `%autoreload 2` with Module classes, in a real IPython shell.

A child process starts an IPython shell, loads the autoreload extension, builds
modules from a file, edits the file and runs the next cell, as a notebook user
does. The reload must not fail, instances made before and after the edit must run
the edited methods, and a compiled call of either must trace again rather than run
the program compiled from the old code.
"""

import json
import subprocess
import sys
import textwrap

from _child_flags import child_env

_BEFORE = """
import jax.numpy as jnp
import boxwood as bw


class Layer(bw.Module):
    w: object
    scale: float = bw.field(static=True, default=1.0)

    def __call__(self, x):
        return self.w * x + 1.0

    def version(self):
        return "v1"


class Stack(bw.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""

_SHELL = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()
ip.run_line_magic("load_ext", "autoreload")
ip.run_line_magic("autoreload", "2")
out = {}
ip.user_ns["out"] = out


def cell(code):
    result = ip.run_cell(code)
    assert result.error_in_exec is None and result.error_before_exec is None, code


cell('''
import jax.numpy as jnp, boxwood as bw, edited
traces = []
def run(model, x):
    traces.append(1)
    return model(x)
f = bw.filter_jit(run)
old = edited.Layer(jnp.ones(2))
stack = edited.Stack([edited.Layer(jnp.ones(2)), edited.Layer(jnp.ones(2))])
out["before"] = [f(old, 1.0).tolist(), f(old, 1.0).tolist(), f(stack, 1.0).tolist(),
                 f(stack, 1.0).tolist(), old.version()]
out["traces_before"] = len(traces)
''')
time.sleep(1.1)  # a newer modification time than the first import's
path = sys.argv[1] + "/edited.py"
source = open(path).read()
open(path, "w").write(source.replace("+ 1.0", "+ 2.0").replace('"v1"', '"v2"'))
cell('''
new = edited.Layer(jnp.ones(2))
out["after"] = [old(1.0).tolist(), new(1.0).tolist(), f(old, 1.0).tolist(),
                f(new, 1.0).tolist(), f(stack, 1.0).tolist(), old.version(),
                new.version(), isinstance(old, edited.Layer)]
out["traces_after"] = len(traces)
''')
time.sleep(1.1)
source = open(path).read()
# a new field: the old instances keep their fields (and their class)
open(path, "w").write(
    source.replace("    w: object\n", "    w: object\n    b: float = 0.5\n")
)
cell('''
newer = edited.Layer(jnp.ones(2))
out["field_added"] = [newer(1.0).tolist(), newer.b, old(1.0).tolist()]
''')
print("RESULT" + json.dumps(out))
"""


def test_autoreload_of_module_classes(tmp_path):
    (tmp_path / "edited.py").write_text(textwrap.dedent(_BEFORE))
    proc = subprocess.run(
        [sys.executable, "-c", _SHELL, str(tmp_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "failed" not in output.lower() and "Error" not in output, output
    out = json.loads(output.split("RESULT", 1)[1].splitlines()[0])
    assert out["before"] == [[2.0, 2.0], [2.0, 2.0], [3.0, 3.0], [3.0, 3.0], "v1"]
    assert out["traces_before"] == 2
    # eager and compiled calls of old and new instances run the edited code; the
    # module holding old layers too
    assert out["after"] == [
        [3.0, 3.0],
        [3.0, 3.0],
        [3.0, 3.0],
        [3.0, 3.0],
        [5.0, 5.0],
        "v2",
        "v2",
        True,
    ]
    assert out["traces_after"] > out["traces_before"]
    assert out["field_added"] == [[3.0, 3.0], 0.5, [3.0, 3.0]]
