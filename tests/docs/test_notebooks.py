"""The notebooks in notebooks/ are committed with their outputs, which make the
claims of their prose. The suite runs each notebook once, in notebooks/conftest.py,
where nbval compares the fresh outputs with these."""

import pathlib
import re

import pytest

from _notebook_pages import RUN_AS_NOTEBOOK, check

nbformat = pytest.importorskip("nbformat")

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize("page", ["docs/getting-started.md", "docs/display.md"])
def test_the_docs_count_the_notebooks(page):
    words = {8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    text = " ".join((ROOT / page).read_text().split())
    count = words[len(NOTEBOOKS)]
    assert re.search(rf"\b(The {count} notebooks in|holds {count} notebooks)", text)


def _committed(path):
    """The notebook with its committed outputs, and its code cells' printed text."""
    notebook = nbformat.read(path, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    outputs = [o for cell in code for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    return notebook, code, outputs, text


def _outputs(notebook):
    return [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_with_its_outputs(path):
    """Every code cell ran, in order, without an error (but in a cell tagged
    `raises-exception`, which shows one on purpose): a reader sees the outputs
    on the repository page, and nbval compares a fresh run of the notebook with
    them (notebooks/conftest.py; the suite's one run of each notebook)."""
    _, code, outputs, _ = _committed(path)
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    raising = [c for c in code if "raises-exception" in c.metadata.get("tags", ())]
    errors = [c for c in code if any(o.output_type == "error" for o in c.outputs)]
    assert errors == raising
    # no run's timestamps (`record_timing`): a refresh changes only outputs
    assert not [c for c in code if "execution" in c.metadata]
    # no warning on stderr, no progress bar (what a reader should not see)
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "Warning" not in stderr and "it/s" not in stderr, stderr[:300]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_outputs_make_the_claims_of_its_prose(path):
    notebook, _, _, text = _committed(path)
    pages = [page for page, name in RUN_AS_NOTEBOOK.items() if name == path.name]
    for page in pages:  # the page's blocks ran as these cells: their results too
        check(ROOT / "docs" / page, notebook, results=True)
    if path.name == "checkpoints.ipynb":
        assert "files: ['step_000060.safetensors', 'step_000070.safetensors']" in text
        assert "resumed from step 70 - same weights: True" in text
        assert "model expects f32[8,1]" in text
        difference = float(text.split("max difference to PyTorch:")[1].split()[0])
        assert difference < 1e-5
    if path.name == "experimenting.ipynb":
        assert "compiled for the 3rd time: global 'LR': 0.0 -> 1.0" in text
        assert "True CacheInfo(hits=0, misses=2, traces=2, size=2)" in text
        assert "True 2.0\nTrue 3.0\n" in text  # new optimizer, edited helper
        assert "[1. 1.]\n[10. 10.]\n" in text  # the redefined class
        assert "[3. 3.] [3. 3.] True" in text  # reloaded: old instance, new code
        (error,) = [o for o in _outputs(notebook) if o.output_type == "error"]
        assert "dot_general requires contracting dimensions" in error.evalue
        shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
        assert "in deep" in shown and "boxwood/_jit" not in shown
    if path.name == "captured_globals.ipynb":
        assert "global 'model'.weight: f32[1,2] -> f32[1,4]" in text
        assert "-0.1\n-0.01\n" in text  # the re-bound learning rate is used
        assert "global 'lr': 0.1 -> 0.01" in text
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


def test_the_comparison_ignores_only_what_varies():
    """notebooks/sanitize.cfg: what nbval replaces before comparing outputs."""
    from nbval.plugin import get_sanitize_patterns

    from _notebook_run import SANITIZE

    patterns = get_sanitize_patterns(SANITIZE.read_text())
    assert patterns  # read as nbval reads it

    def sanitize(text):
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    assert sanitize("<object at 0x7f3a2b1c>") == sanitize("<object at 0x55d0e1f2>")
    assert sanitize("took 1.23 s") == sanitize("took 0.98 s")
    assert sanitize("max difference: 1.1e-05") == sanitize("max difference: 3.2e-07")
    assert sanitize("/tmp/tmpab12cd/step_0") == sanitize("/tmp/tmpzz99yy/step_0")
    assert sanitize("[1.3865862 0.7028286]") == sanitize("[1.3865871 0.7028279]")
    for claim in ("same weights: True", "hits=199, misses=1", "f32[8,1]", "0.5"):
        assert sanitize(claim) == claim
    assert sanitize("max difference: 0.25") != sanitize("max difference: 1.1e-05")
    assert sanitize("loss 0.8538") != sanitize("loss 0.8539")


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
        "validation accuracy",
        "Set the label of an example without one (a GLUE test split's -1) to -100",
        "loss over the labelled examples",
    ],
    "stateful_batchnorm.ipynb": [
        "running mean starts at [0. 0. 0. 0.]",
        "one example alone equals it inside a batch: True",
        "CacheInfo(hits=199, misses=1, traces=1, size=1)",
    ],
}


def test_a_changed_output_fails_the_notebooks_run(tmp_path):
    """The suite's run of a notebook (notebooks/conftest.py) fails at the first
    cell whose fresh output differs from the committed one, once sanitized."""
    import subprocess
    import sys

    from _child_flags import child_env

    v4 = nbformat.v4
    cells = [
        v4.new_code_cell(
            'print("at 0x7f00aa11bb22")',
            execution_count=1,
            outputs=[v4.new_output("stream", name="stdout", text="at 0x55dd00ee\n")],
        ),
        v4.new_code_cell(
            "print(1 + 1)",
            execution_count=2,
            outputs=[v4.new_output("stream", name="stdout", text="3\n")],
        ),
    ]
    nbformat.write(v4.new_notebook(cells=cells), tmp_path / "changed.ipynb")
    (tmp_path / "conftest.py").write_text(  # notebooks/conftest.py's collector
        f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from _notebook_run import NotebookFile\n\n"
        "def pytest_collect_file(file_path, parent):\n"
        "    if file_path.suffix == '.ipynb':\n"
        "        return NotebookFile.from_parent(parent, path=file_path)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "no:xdist", str(tmp_path)],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "1 failed" in done.stdout, done.stdout[-2000:]
    assert "Cell 1: " in done.stdout and "mismatch 'stdout'" in done.stdout
    assert "Cell 0: " not in done.stdout  # the address is sanitized
