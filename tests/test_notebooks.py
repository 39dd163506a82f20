"""Every notebook in notebooks/ runs from top to bottom without an error."""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted(
    (pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")
)


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute(
        cwd=str(path.parent)
    )
    outputs = [
        o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
    ]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    for expected in EXPECTED.get(path.name, ()):
        assert expected in text, f"{path.name} no longer prints {expected!r}"


# What each notebook must print: the claims its prose makes.
EXPECTED = {
    "quickstart.ipynb": [
        "CacheInfo(hits=199, misses=1, traces=1, size=1)",
        "args[2]: Python float 0.5 -> Python float 2.0",
    ],
    "several_models.ipynb": ["CacheInfo(hits=299, misses=1, traces=1, size=1)"],
    "static_dynamic_and_recompiles.ipynb": [
        "evaluation is deterministic: True",
        "evaluation mode (static flag)          traces=2  "
        "args[0].dropout.inference: False -> True",
        "a batch of another size                traces=3  args[1]: f32[8,4] -> f32[16,4]",
        "another array value: no retrace        traces=5  cache hit",
    ],
    "stateful_batchnorm.ipynb": [
        "running mean starts at [0. 0. 0. 0.]",
        "one example alone equals it inside a batch: True",
        "CacheInfo(hits=199, misses=1, traces=1, size=1)",
    ],
}
