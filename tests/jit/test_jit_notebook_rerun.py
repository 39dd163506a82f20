"""A real Jupyter kernel runs the edit-and-re-run cell sequences of notebook
experimentation, in the order a person runs them, and every compiled call gives
the fresh result (`_jit/_capture/`): a global number rebound twice, a re-created
optax optimiser, an edited helper, a global read inside a module's method, a
module class defined again, and a list in a static field (warned at
construction). Under IPython the third compile of one function prints a note."""

import os
import pathlib

import pytest

import boxwood as bw
from _child_flags import child_env

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELLS = [
    """
import jax, jax.numpy as jnp, optax, boxwood as bw
x = jnp.ones(())
LR = 0.1
""",
    """
@bw.filter_jit
def step(x):
    return x * LR
print("lr", float(step(x)))
""",
    "LR = 0.0",
    'print("lr", float(step(x)))',
    "LR = 1.0",
    'print("lr", float(step(x)))',
    """
optimizer = optax.sgd(0.1)
grads = {"w": jnp.ones(())}
state = optimizer.init(grads)

@bw.filter_jit
def update(grads, state):
    return optimizer.update(grads, state)[0]
print("sgd", float(update(grads, state)["w"]))
""",
    "optimizer = optax.sgd(0.0)",
    'print("sgd", float(update(grads, state)["w"]))',
    """
def helper(x):
    return x * 5.0

@bw.filter_jit
def uses_helper(x):
    return helper(x)
print("helper", float(uses_helper(x)))
""",
    """
def helper(x):
    return x * 3.0
""",
    'print("helper", float(uses_helper(x)))',
    """
SCALE = 2.0

class Model(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x * SCALE

model = Model(jnp.ones(()))
forward = bw.filter_jit(lambda m, x: m(x))
print("scale", float(forward(model, x)), float(bw.filter_jit(model)(x)))
""",
    "SCALE = 3.0",
    'print("scale", float(forward(model, x)), float(bw.filter_jit(model)(x)))',
    """
class Block(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w + x

@bw.filter_jit
def build(x):
    return Block(jnp.ones(()))(x)
print("class", float(build(x)))
""",
    """
class Block(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w - x
""",
    'print("class", float(build(x)))',
    """
class Config(bw.Module):
    sizes: list = bw.field(static=True)

config = Config([1, 2])
""",
]


def test_edited_and_rerun_cells_give_fresh_results(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source.strip()) for source in CELLS]
    src = str(pathlib.Path(bw.__file__).resolve().parents[1])  # this boxwood
    path = os.environ.get("PYTHONPATH")
    env = child_env(PYTHONPATH=src if not path else f"{src}{os.pathsep}{path}")
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute(
        cwd=str(tmp_path), env=env
    )
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    out = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    err = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    results = [line for line in out.splitlines() if not line.startswith("boxwood:")]
    assert results == [
        "lr 0.10000000149011612",
        "lr 0.0",
        "lr 1.0",
        "sgd -0.10000000149011612",
        "sgd -0.0",
        "helper 5.0",
        "helper 3.0",
        "scale 2.0 2.0",
        "scale 3.0 3.0",
        "class 2.0",
        "class 0.0",
    ]
    notes = [line for line in out.splitlines() if line.startswith("boxwood:")]
    assert notes == [
        "boxwood: filter_jit(step) compiled for the 3rd time: global 'LR': "
        "0.0 -> 1.0 (`boxwood.config.recompile_notes = False` silences this)"
    ]
    assert "`Config.sizes` is a static field holding a list" in err
    assert "Use a tuple." in err
