"""Pages of docs/ whose code runs as a notebook, for tests/docs/test_docs_code.py and
tests/docs/test_notebooks.py.

A page listed in `RUN_AS_NOTEBOOK` is not run block by block: its notebook's code
cells hold the page's Python blocks verbatim and in the same order, with cells of
the notebook's own (plots, prints) between them, and each `>>>` line of the page's
doctests is a cell of its own whose result is the doctest's expected output; a
```` ```text ```` block right after a Python block shows what its cell prints. So
running the notebook once runs the page: `check` compares the two, on the
notebook's sources alone or on its committed results too (which nbval holds
equal to a fresh run's).
"""

from __future__ import annotations

import doctest
import pathlib
from typing import Any, NamedTuple

from _markdown_blocks import ROOT, blocks

# the page under docs/ -> its notebook under notebooks/
RUN_AS_NOTEBOOK = {"training.md": "training.ipynb"}


class PageCell(NamedTuple):
    """A cell that one of a page's runnable blocks becomes."""

    source: str
    result: str | None  # a doctest's expected result
    printed: str | None  # the ```text block shown right after a Python block
    section: str | None  # the `## ` heading it stands under (None before one)


def page_cells(page: pathlib.Path) -> list[PageCell]:
    """The cells the page's runnable blocks become, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    cells: list[PageCell] = []
    for block in blocks(page):
        if block.skip_reason:
            continue
        section = _heading_before(lines[: block.line - 1])
        if not block.is_doctest:
            printed = None if block.hidden else _shown_after(lines, block.line - 1)
            cells.append(PageCell(block.code.strip(), None, printed, section))
            continue
        for example in doctest.DocTestParser().get_examples(block.code):
            want = example.want.strip()
            cells.append(PageCell(example.source.strip(), want, None, section))
    return cells


def _shown_after(lines: list[str], start: int) -> str | None:
    """The text of a ```text block that follows, past blank lines, the code
    block whose first code line is `lines[start]` (None if none does)."""
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
    after = next((i for i in range(end + 1, len(lines)) if lines[i].strip()), None)
    if after is None or lines[after].strip() != "```text":
        return None
    close = lines.index("```", after + 1)
    return _lines_stripped("\n".join(lines[after + 1 : close]))


def _lines_stripped(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _heading_before(lines: list[str]) -> str | None:
    """The last `## ` heading among `lines` (markdown source), or None."""
    headings = [line[3:].strip() for line in lines if line.startswith("## ")]
    return headings[-1] if headings else None


def _sections(notebook: Any) -> list[str | None]:
    """For each cell of `notebook`, the `## ` heading of the last markdown cell
    before it that has one (None before the first)."""
    found: list[str | None] = []
    current: str | None = None
    for cell in notebook.cells:
        found.append(current)
        if cell.cell_type == "markdown":
            current = _heading_before(cell.source.splitlines()) or current
    return found


def _printed(cell: Any) -> str:
    return _lines_stripped(
        "".join(
            o.text
            for o in cell.outputs
            if o.output_type == "stream" and o.name == "stdout"
        )
    )


def _result(cell: Any) -> str | None:
    texts = [
        o["data"]["text/plain"]
        for o in cell.outputs
        if o.output_type == "execute_result"
    ]
    return texts[0].strip() if texts else None


def check(page: pathlib.Path, notebook: Any, results: bool) -> None:
    """Raise `AssertionError` naming the first block of `page` that `notebook`
    (an `nbformat` notebook) does not hold in order under the same `## `
    heading, or, with `results`, whose doctest result, or the output the page
    shows after it (a ```text block), differs from the executed cell's."""
    sections = _sections(notebook)
    code = iter(
        (c, sections[i]) for i, c in enumerate(notebook.cells) if c.cell_type == "code"
    )
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    for source, want, printed, section in page_cells(page):
        cell, under = next(
            ((c, s) for c, s in code if c.source.strip() == source), (None, None)
        )
        first = source.splitlines()[0]
        assert cell is not None, (
            f"{name}: no code cell of the notebook, after the previous block's, "
            f"is the block starting {first!r} verbatim"
        )
        assert under == section, (
            f"{name}: the cell {first!r} stands under the notebook's heading "
            f"{under!r}, the page's block under {section!r}"
        )
        if results and want is not None:
            got = _result(cell)
            assert got == want, (
                f"{name}: the cell {first!r} gave {got!r}, the page says {want!r}"
            )
        if results and printed is not None:
            shown = _printed(cell)
            assert shown == printed, (
                f"{name}: the cell {first!r} printed {shown!r}, the page shows "
                f"{printed!r}"
            )
