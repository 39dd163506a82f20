"""Every Python code block of README.md and docs/*.md runs, so the docs cannot drift
from the code. The blocks of a page share one namespace and run in order; blocks of
`>>>` lines are doctests. A block that cannot run here says why, in a
`<!-- docs-test: skip (reason) -->` comment just above it (see _markdown_blocks.py).
"""

import doctest
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import boxwood
from _child_flags import child_env, xla_flags_with_devices
from _markdown_blocks import PAGES, ROOT, Block, blocks, devices, parts
from _notebook_pages import RUN_AS_NOTEBOOK, check

# Pages run as their notebooks (tests/_notebook_pages.py) are checked against them
# here and run as those notebooks (notebooks/conftest.py).
RUNNABLE = [
    p
    for p in PAGES
    if any(not b.skip_reason for b in blocks(p)) and p.name not in RUN_AS_NOTEBOOK
]
# A page cut into parts is a test per part (tests/_markdown_blocks.py)
RUNNABLE_PARTS = [(p, part) for p in RUNNABLE for part in range(parts(p))]


def _part_id(case: tuple[pathlib.Path, int]) -> str:
    page, part = case
    name = str(page.relative_to(ROOT))
    return name if parts(page) == 1 else f"{name}:part{part + 1}"


def _run(block: Block, namespace: dict) -> None:
    if block.is_doctest:
        parser = doctest.DocTestParser()
        test = parser.get_doctest(block.code, namespace, block.where, block.where, 0)
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        runner = doctest.DocTestRunner(optionflags=flags)
        out = []
        runner.run(test, out=out.append, clear_globs=False)
        assert not runner.failures, f"{block.where}: doctest failed\n" + "".join(out)
        return
    try:
        exec(compile(block.code, block.where, "exec"), namespace)
    except Exception as error:
        raise AssertionError(f"the block at {block.where} raised {error!r}") from error


def run_page(page: pathlib.Path, part: int = 0) -> None:
    """Run the blocks of the page's `part` in order in one namespace, in the current
    folder, with JAX's default promotion rules (a reader's session; the test
    suite's conftest makes them strict)."""
    namespace = {"__name__": "__docs__"}
    explain = boxwood.config.explain_recompiles  # a page may switch it on
    try:
        with (
            jax.numpy_dtype_promotion("standard"),
            jax.numpy_rank_promotion("allow"),
        ):
            for block in blocks(page):
                if block.part == part and not block.skip_reason:
                    _run(block, namespace)
    finally:
        boxwood.config.explain_recompiles = explain


# Packages of the test extra that a page's examples may import; where one is not
# installed (a machine that runs the suite without it), the page is skipped, naming
# it. CI installs them all.
OPTIONAL = {
    "equinox",
    "flax",
    "matplotlib",
    "orbax",
    "tokenizers",
    "torch",
    "transformers",
}
_IMPORT = re.compile(r"^\s*(?:from|import)\s+(\w+)", re.M)


def _imported(page: pathlib.Path, part: int) -> set[str]:
    """The top-level packages that the blocks of the page's `part` import."""
    code = [b.code for b in blocks(page) if b.part == part and not b.skip_reason]
    return {name for text in code for name in _IMPORT.findall(text)}


@pytest.mark.parametrize("case", RUNNABLE_PARTS, ids=_part_id)
def test_the_code_blocks_of_a_page_run(case, tmp_path, monkeypatch):
    page, part = case
    for name in sorted(_imported(page, part) & OPTIONAL):
        pytest.importorskip(name, reason=f"the page's examples import {name}")
    monkeypatch.chdir(tmp_path)  # a scratch folder for the files examples write
    n = devices(page, part)
    if n == 1:
        run_page(page, part)
        return
    # n simulated CPU devices, whatever this process's backend
    env = child_env(XLA_FLAGS=xla_flags_with_devices(n))
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(ROOT / "tests"),
            os.path.dirname(__file__),
            *filter(None, [env.get("PYTHONPATH")]),
        ]
    )
    code = (
        "from test_docs_code import run_page; "
        f"run_page(__import__('pathlib').Path({str(page)!r}), {part})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("name", sorted(RUN_AS_NOTEBOOK))
def test_a_page_run_as_a_notebook_is_its_code_cells(name):
    """The notebook holds the page's blocks verbatim, in order (its committed
    outputs hold the doctests' results, checked in tests/docs/test_notebooks.py, and a
    fresh run gives those outputs, checked by nbval in notebooks/conftest.py)."""
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(ROOT / "notebooks" / RUN_AS_NOTEBOOK[name], as_version=4)
    check(ROOT / "docs" / name, notebook, results=False)


def test_a_page_block_missing_from_its_notebook_is_named(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n```python\ny = x\n```\n\n```pycon\n>>> y\n1\n```\n"
    )
    cell = nbformat.v4.new_code_cell
    notebook = nbformat.v4.new_notebook(
        cells=[cell("x = 1"), cell("plot()"), cell("y = x"), cell("y")]
    )
    check(page, notebook, results=False)
    notebook.cells[3].outputs = [
        nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)
    ]
    with pytest.raises(
        AssertionError, match=r"the cell 'y' gave '2', the page says '1'"
    ):
        check(page, notebook, results=True)
    notebook.cells[2].source = "y = x + 0"
    with pytest.raises(AssertionError, match=r"is the block starting 'y = x' verbatim"):
        check(page, notebook, results=False)
    swapped = nbformat.v4.new_notebook(cells=[cell("y = x"), cell("x = 1"), cell("y")])
    with pytest.raises(AssertionError, match=r"starting 'y = x' verbatim"):
        check(page, swapped, results=False)


def test_a_notebook_cell_under_another_heading_than_its_block_is_named(tmp_path):
    """The notebook's `## ` headings stand where the page's do: a heading that
    came after its section's first cell (as the training notebook's sampling
    heading once did) is named."""
    nbformat = pytest.importorskip("nbformat")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```python\nx = 1\n```\n\n## Sampling\n\nText.\n\n"
        "```python\ny = x\n```\n"
    )
    cell, text = nbformat.v4.new_code_cell, nbformat.v4.new_markdown_cell
    notebook = nbformat.v4.new_notebook(
        cells=[cell("x = 1"), text("## Sampling\n\nText."), cell("y = x")]
    )
    check(page, notebook, results=False)
    late = nbformat.v4.new_notebook(
        cells=[cell("x = 1"), cell("y = x"), text("## Sampling\n\nText.")]
    )
    with pytest.raises(
        AssertionError,
        match=r"the cell 'y = x' stands under the notebook's heading None, "
        r"the page's block under 'Sampling'",
    ):
        check(page, late, results=False)


def test_a_shown_output_the_notebook_does_not_print_is_named(tmp_path):
    """A ```text block right after a Python block is what its cell printed."""
    nbformat = pytest.importorskip("nbformat")
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint('accuracy 84.4%')\n```\n\n```text\naccuracy 84.4%\n```\n"
    )
    printed = nbformat.v4.new_code_cell("print('accuracy 84.4%')")
    printed.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
        nbformat.v4.new_output("stream", text="accuracy 84.4%  \n"),
    ]
    notebook = nbformat.v4.new_notebook(cells=[printed])
    check(page, notebook, results=True)
    printed.outputs = [nbformat.v4.new_output("stream", text="accuracy 86.0%\n")]
    with pytest.raises(
        AssertionError,
        match=r"printed 'accuracy 86.0%', the page shows 'accuracy 84.4%'",
    ):
        check(page, notebook, results=True)
    check(page, notebook, results=False)  # the sources alone still agree
    # hidden setup code shows nothing: the text block is the next block's
    page.write_text("<!-- docs-test: setup\nx = 1\n-->\n\n" + page.read_text())
    setup = nbformat.v4.new_code_cell("x = 1")
    printed.outputs = [nbformat.v4.new_output("stream", text="accuracy 84.4%\n")]
    check(page, nbformat.v4.new_notebook(cells=[setup, printed]), results=True)


def test_skipped_blocks_say_why_and_are_few():
    skipped = [b for p in PAGES for b in blocks(p) if b.skip_reason]
    assert all(len(b.skip_reason) > 10 for b in skipped)
    total = sum(len(blocks(p)) for p in PAGES)
    assert len(skipped) * 5 <= total, [b.where for b in skipped]


def test_the_collector_finds_blocks_and_skip_marks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip (needs 8 GPUs) -->\n"
        "```python\nboom()\n```\n\n```bash\nls\n```\n\n```python\n>>> x + 1\n2\n```\n"
    )
    found = blocks(page)
    assert [(b.line, b.skip_reason, b.is_doctest) for b in found] == [
        (4, None, False),
        (9, "needs 8 GPUs", False),
        (17, None, True),
    ]
    namespace = {}
    _run(found[0], namespace)
    _run(found[2], namespace)
    wrong = Block(page, 16, ">>> x + 1\n3\n", None)
    with pytest.raises(AssertionError, match=r"page.md:16: doctest failed"):
        _run(wrong, namespace)
    with pytest.raises(AssertionError, match=r"block at .*page.md:9 raised NameError"):
        _run(found[1], namespace)


def test_the_packages_a_page_imports_are_found_in_its_hidden_blocks_too(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: setup\nimport torch\nfrom safetensors.torch import save_file\n-->"
        "\n\n```python\nimport jax, jax.numpy as jnp\n  from tokenizers import X\n```\n\n"
        "<!-- docs-test: skip (needs 8 GPUs) -->\n```python\nimport flax\n```\n"
    )
    assert _imported(page, 0) == {"torch", "safetensors", "jax", "tokenizers"}
    assert _imported(page, 0) & OPTIONAL == {"torch", "tokenizers"}


def test_a_page_cut_into_parts_runs_each_part_afresh(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: devices 8 -->\n\n```python\nx = 1\n```\n\n"
        "<!-- docs-test: new part -->\n\n<!-- docs-test: setup\ny = 2\n-->\n\n"
        "```python\nz = y + 1\n```\n\n```python\nx\n```\n"
    )
    assert parts(page) == 2
    assert [(b.line, b.part, b.hidden) for b in blocks(page)] == [
        (4, 0, False),
        (10, 1, True),
        (14, 1, False),
        (18, 1, False),
    ]
    assert (devices(page, 0), devices(page, 1)) == (8, 1)
    run_page(page, 0)
    # the second part's namespace starts empty: `x` of the first is not there
    with pytest.raises(AssertionError, match=r"page.md:18 raised NameError"):
        run_page(page, 1)


def test_every_page_with_python_is_collected():
    pages = {str(p.relative_to(ROOT)) for p in PAGES}
    assert "README.md" in pages and "docs/getting-started.md" in pages
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("**/*.md")}
    assert on_disk and on_disk <= pages  # sub-folders (docs/api/) included


@pytest.mark.parametrize("fence", ["```", "```python3", "```pyton"])
def test_a_fence_that_cannot_be_classified_is_refused(tmp_path, fence):
    page = tmp_path / "page.md"
    page.write_text(f"text\n\n```python\nx = 1\n```\n\n{fence}\nprint(x)\n```\n")
    with pytest.raises(ValueError, match=r"page.md:7: a code fence of language"):
        blocks(page)


def test_a_shown_only_fence_is_not_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```text\nboom()\n```\n\n```bash\nls\n```\n")
    assert blocks(page) == []
