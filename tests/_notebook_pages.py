"""Pages of docs/ whose code runs as a notebook, for tests/docs/test_docs_code.py and
tests/docs/test_notebooks.py.

A page listed in `RUN_AS_NOTEBOOK` is not run block by block: its notebook's code
cells hold the page's Python blocks verbatim and in the same order, with cells of
the notebook's own (plots, prints) between them, and each `>>>` line of the page's
doctests is a cell of its own whose result is the doctest's expected output. So
running the notebook once runs the page: `check` compares the two, on the
notebook's sources alone or on its committed results too (which nbval holds
equal to a fresh run's).
"""

from __future__ import annotations

import doctest
import pathlib
from typing import Any

from _markdown_blocks import ROOT, blocks

# the page under docs/ -> its notebook under notebooks/
RUN_AS_NOTEBOOK = {"training.md": "training.ipynb"}


def page_cells(page: pathlib.Path) -> list[tuple[str, str | None]]:
    """`(source, expected result or None)` for each cell the page's runnable
    blocks become, in order."""
    cells: list[tuple[str, str | None]] = []
    for block in blocks(page):
        if block.skip_reason:
            continue
        if not block.is_doctest:
            cells.append((block.code.strip(), None))
            continue
        for example in doctest.DocTestParser().get_examples(block.code):
            cells.append((example.source.strip(), example.want.strip()))
    return cells


def _result(cell: Any) -> str | None:
    texts = [
        o["data"]["text/plain"]
        for o in cell.outputs
        if o.output_type == "execute_result"
    ]
    return texts[0].strip() if texts else None


def check(page: pathlib.Path, notebook: Any, results: bool) -> None:
    """Raise `AssertionError` naming the first block of `page` that `notebook`
    (an `nbformat` notebook) does not hold in order, or, with `results`, whose
    doctest result differs from the executed cell's."""
    code = iter(c for c in notebook.cells if c.cell_type == "code")
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    for source, want in page_cells(page):
        cell = next((c for c in code if c.source.strip() == source), None)
        first = source.splitlines()[0]
        assert cell is not None, (
            f"{name}: no code cell of the notebook, after the previous block's, "
            f"is the block starting {first!r} verbatim"
        )
        if results and want is not None:
            got = _result(cell)
            assert got == want, (
                f"{name}: the cell {first!r} gave {got!r}, the page says {want!r}"
            )
