"""The Python code blocks of the README and docs/*.md, for tests/docs/test_docs_code.py.

A block is a fenced ```` ```python ```` (or ```` ```pycon ````) block. The blocks of one
page run in order in one namespace, as a reader runs them one after the other. A
block whose lines start with `>>>` is checked as a doctest (its printed output must
match). A block that cannot run in the test suite is preceded by the HTML comment
`<!-- docs-test: skip (the reason) -->`, which the rendered page does not show.

What a reader has at hand from the text around a block (a trained `model`, a
`batch`) is given by hidden setup code, an HTML comment run where it stands:

    <!-- docs-test: setup
    model = nn.MLP(2, 1, 32, 2, key=jax.random.key(0))
    -->

A page whose examples need several devices says so once, `<!-- docs-test: devices
8 -->`: its blocks then run in a subprocess with that many simulated CPU devices.

A long page may be cut into parts, each a test of its own, so that the suite's
workers share its time: `<!-- docs-test: new part -->` starts a part, whose
blocks run in a fresh namespace (what it needs from the text above, the imports
at least, is its own hidden setup). A devices comment then holds for the part it
stands in, and a part without one runs in the test's own process.

Every fence names its language: a Python one (`python`, `pycon`, `py`) runs, one of
`NOT_PYTHON` (shell commands, program output, data) is shown only, and any other
(an untagged fence, `python3`) is refused with its place, so no example is silently
left untested. Every page under `docs/` is read, sub-folders included.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON = frozenset({"python", "pycon", "py"})
NOT_PYTHON = frozenset(
    {"bash", "sh", "console", "text", "json", "toml", "yaml", "ini", "diff", "html"}
)

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*$")
SKIP = re.compile(r"^<!-- docs-test: skip \((?P<reason>[^)]+)\) -->$")
_SETUP = "<!-- docs-test: setup"
_DEVICES = re.compile(r"^<!-- docs-test: devices (\d+) -->$")
_PART = "<!-- docs-test: new part -->"


@dataclasses.dataclass(frozen=True)
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the code's first line
    code: str
    skip_reason: str | None
    hidden: bool = False  # setup code in an HTML comment
    part: int = 0  # the page's part (0 on a page of one part)

    @property
    def is_doctest(self) -> bool:
        return self.code.lstrip().startswith(">>>")

    @property
    def where(self) -> str:
        page = (
            self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        )
        return f"{page}:{self.line}"


def _parts(page: pathlib.Path) -> list[list[str]]:
    """The page's lines, cut into its parts (each `_PART` line starts one)."""
    found: list[list[str]] = [[]]
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip() == _PART:
            found.append([])
        found[-1].append(line)
    return found


def parts(page: pathlib.Path) -> int:
    """How many parts the page is cut into (1 unless it says)."""
    return len(_parts(page))


def devices(page: pathlib.Path, part: int = 0) -> int:
    """How many devices the examples of the page's `part` need (1 unless it says)."""
    found = [m for line in _parts(page)[part] if (m := _DEVICES.match(line.strip()))]
    return int(found[0][1]) if found else 1


def blocks(page: pathlib.Path) -> list[Block]:
    """The Python blocks of `page`, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i, part = [], 0, 0
    while i < len(lines):
        if lines[i].strip() == _PART:
            part += 1
        if lines[i].strip() == _SETUP:
            end = lines.index("-->", i)
            code = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(page, i + 2, code, None, hidden=True, part=part))
            i = end + 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, lang = len(fence["indent"]), fence["lang"]
        if lang not in PYTHON | NOT_PYTHON:
            where = Block(page, i + 1, "", None).where
            raise ValueError(
                f"{where}: a code fence of language {lang or '(none)'!r}: tag it "
                f"`python` to run it, or one of {sorted(NOT_PYTHON)} to show it only"
            )
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        if lang in PYTHON:
            previous = lines[i - 1].strip() if i else ""
            skip = SKIP.match(previous)
            body = "\n".join(line[indent:] for line in lines[i + 1 : end])
            reason = skip and skip["reason"]
            found.append(Block(page, i + 2, body + "\n", reason, part=part))
        i = end + 1
    return found
