"""Every notebook in notebooks/ runs from top to bottom without an error."""

import pathlib

import pytest

from _child_flags import child_env, xla_flags_for_running
from _notebook_pages import RUN_AS_NOTEBOOK, check

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(
    p
    for p in (ROOT / "notebooks").glob("*.ipynb")
    if not p.stem.endswith("-run")  # executed copies (notebooks/README.md)
)


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("listing", ["notebooks/README.md", "docs/display.md"])
def test_the_docs_list_every_notebook(listing):
    text = (ROOT / listing).read_text()
    assert [p.name for p in NOTEBOOKS if f"`{p.name}`" not in text] == []
    assert "jupyter execute notebooks/quickstart.ipynb" in text  # headless run


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    env = child_env()  # the kernel is a child process
    if path.name == "training.ipynb":
        # hundreds of training steps: the kernel compiles for running them
        env["XLA_FLAGS"] = xla_flags_for_running()
    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute(
        cwd=str(path.parent), env=env
    )
    pages = [page for page, name in RUN_AS_NOTEBOOK.items() if name == path.name]
    for page in pages:  # the page's blocks ran as these cells: their results too
        check(ROOT / "docs" / page, notebook, results=True)
    outputs = [
        o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
    ]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    if path.name == "checkpoints.ipynb":
        assert "files: ['step_000060.safetensors', 'step_000070.safetensors']" in text
        assert "resumed from step 70 - same weights: True" in text
        assert "model expects f32[8,1]" in text
        difference = float(text.split("max difference to PyTorch:")[1].split()[0])
        assert difference < 1e-5
    if path.name == "quickstart.ipynb":
        assert "CacheInfo(hits=199, misses=1, traces=1, size=1)" in text
        assert "args[2]: Python float 0.5 -> Python float 2.0" in text
    if path.name == "captured_globals.ipynb":
        assert "global 'model'.weight: f32[1,2] -> f32[1,4]" in text
        assert "global 'lr' changed from 0.1 to 0.01 since step was compiled" in text
        assert "CacheInfo(hits=2, misses=1, traces=1, size=1)" in text
    if path.name == "scaling_out.ipynb":
        assert "devices: 8" in text
        assert text.count("matches single device: True") == 3
        assert "mlp.layers.1.weight, one shard: [(8, 64)]" in text  # FSDP
        assert "mlp.layers.1.weight (row):    [(64, 16)]" in text
        assert "rules[0] = ('mlp\\\\..*', P('model',)) does not fit leaf" in text
        assert "the batch size 12 is not divisible by 8" in text
        assert "CacheInfo(hits=4, misses=1, traces=1, size=1)" in text
    if path.name == "pretrained_models.ipynb":
        difference = float(text.split("max difference to PyTorch:")[1].split()[0])
        assert difference < 1e-4
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
    "pretrained_models.ipynb": [
        "devices: 8",
        "same tokens as transformers: True",
        "c_attn.weight (64, 192) one shard: {(64, 48)}",
        "matches single device: True",
        "sharded generation equal: True",
        "round trip difference: 0.0",
        "transformer.h.layers.attn.c_attn.weight",
        "stacked: (2, 64, 192)  block 0: (64, 192)",
    ],
    # the claims are the page's asserts and doctests (checked as they run)
    "training.ipynb": [
        "(ln 256 = 5.55)",
        "step 300: train",
        "test accuracy",
    ],
    "stateful_batchnorm.ipynb": [
        "running mean starts at [0. 0. 0. 0.]",
        "one example alone equals it inside a batch: True",
        "CacheInfo(hits=199, misses=1, traces=1, size=1)",
    ],
}
