"""Find where boxwood's source builds exceptions, and match them against the error
catalogue (docs/errors.md). Used by tests/errors/test_error_catalogue.py.

A *site* is a call that constructs an exception (`ValueError(...)`,
`CheckpointError(...)`, ...), a call of a helper in MESSAGE_HELPERS, or a bare
`raise SomeError`. Its *key* is the start of its message: the first KEY_WORDS words
of the literal text, with HOLE where an f-string field, a `.format` field or a `%s`
goes (messages held in variables and module-level constants, also imported ones,
are followed). A catalogue entry is one row of a table in docs/errors.md; it covers
a site when it names the site's exception class and contains the key's literal
fragments in order, anything standing in for the holes (backticks and runs of
spaces are ignored on both sides). A site whose message has too little literal text
(key None) is covered by nothing: it needs an entry in the test's allow-list.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
CATALOGUE = ROOT / "docs" / "errors.md"

# a key is the message's first KEY_WORDS words, with at least MIN_KEY literal
# characters; HOLE marks where a value is inserted
KEY_WORDS = 6
MIN_KEY = 10
HOLE = "…"
_EDGE = " .,:;"  # stripped from the two ends of a key
_EXCEPTION_NAME = re.compile(r"(Error|Exception|Exit|Interrupt)$")
_FORMAT_FIELD = re.compile(r"\{[^{}]*\}|%[sdrf]")
_BACKTICKED = re.compile(r"`([^`\n]+)`")


# Functions that build an exception from a message they are given: name ->
# (exception class, index of the message argument). Their calls are sites.
MESSAGE_HELPERS = {"_leaf_error": ("CheckpointError", 1)}


@dataclasses.dataclass(frozen=True)
class Site:
    file: str  # relative to the repository root
    line: int
    function: str  # the enclosing function's qualified name ("" at module level)
    exc: str  # the exception class's name
    key: str | None  # None: the message has no literal part long enough
    # the names the message puts in backticks (`max_rows`), from its literal text
    names: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line} ({self.function or 'module'})"
        return f"{where}: {self.exc}({self.key!r})"


def normalise(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _exception_name(node: ast.expr) -> str | None:
    name = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else None
    )
    if name and name[:1].isupper() and _EXCEPTION_NAME.search(name):
        return name
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, file: str, tree: ast.Module, constants: dict) -> None:
        self.file = file
        self.constants = constants
        self.sites: list[Site] = []
        self.scopes: list[ast.AST] = [tree]
        self.names: list[str] = []

    # --- scopes
    def _visit_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        self.scopes.append(node)
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_scope

    # --- sites
    def _add(self, node: ast.AST, exc: str, message: ast.expr | None) -> None:
        pieces = self._pieces(message, depth=0) if message is not None else [None]
        literal = "".join(p or HOLE for p in pieces)
        names = tuple(
            n for n in _BACKTICKED.findall(literal) if not _FORMAT_FIELD.search(n)
        )
        site = Site(self.file, node.lineno, ".".join(self.names), exc, _key(pieces))
        self.sites.append(dataclasses.replace(site, names=names))

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is not None:
            name = _exception_name(node.exc)
            if name is not None:  # `raise SomeError` without a call
                self._add(node, name, None)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _exception_name(node.func)
        helper = MESSAGE_HELPERS.get(getattr(node.func, "id", None))
        if name is not None:
            message = node.args[0] if node.args else None
            self._add(node, name, message)
        elif helper is not None and len(node.args) > helper[1]:
            self._add(node, helper[0], node.args[helper[1]])
        self.generic_visit(node)

    # --- messages
    def _assigned(self, name: str) -> ast.expr | None:
        """The value first assigned to `name` in the innermost scope that assigns it."""
        for scope in reversed(self.scopes):
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = scope.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                if any(p is not None and p.arg == name for p in params):
                    return None  # a parameter: its value is not known here
            for stmt in ast.walk(scope):
                if (
                    isinstance(stmt, ast.Assign)
                    and any(
                        isinstance(t, ast.Name) and t.id == name for t in stmt.targets
                    )
                ) or (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == name
                    and stmt.value is not None
                ):
                    return stmt.value
        return self.constants.get(name)

    def _pieces(self, node: ast.expr | None, depth: int) -> list[str | None]:
        """The message as literal strings and holes (`None`)."""
        if node is None or depth > 5:
            return [None]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):
            pieces: list[str | None] = []
            for v in node.values:
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    pieces.append(v.value)
                elif isinstance(v, ast.FormattedValue) and isinstance(
                    v.value, ast.Name
                ):
                    pieces += self._pieces(v.value, depth + 1)  # a named constant
                else:
                    pieces.append(None)
            return pieces
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._pieces(node.left, depth + 1) + self._pieces(
                node.right, depth + 1
            )
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return self._pieces(node.left, depth + 1)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
        ):
            return self._pieces(node.func.value, depth + 1)
        if isinstance(node, ast.IfExp):
            return self._pieces(node.body, depth + 1)
        if isinstance(node, ast.Name):
            return self._pieces(self._assigned(node.id), depth + 1)
        return [None]


def _key(pieces: list[str | None]) -> str | None:
    """The message's first `KEY_WORDS` words as a pattern: its literal fragments
    joined by `.*?` (which stands for a hole), or `None` if it has too little
    literal text to recognise."""
    tokens: list[str | None] = []  # literal text, or None for a hole
    for piece in pieces:
        parts = [None] if piece is None else _FORMAT_FIELD.split(piece)
        for i, part in enumerate(parts):
            if i:
                tokens.append(None)
            if part is not None and tokens and isinstance(tokens[-1], str):
                tokens[-1] += part  # adjacent literals: one fragment
            else:
                tokens.append(part)
    fragments: list[str] = []
    words = 0
    for token in tokens:
        if words >= KEY_WORDS:
            break
        taken = (token or "").replace("`", "").split()[: KEY_WORDS - words]
        if taken:
            words += len(taken)
            fragments.append(" ".join(taken))
        elif token is None and fragments and fragments[-1] != HOLE:
            fragments.append(HOLE)
    literal = [f for f in fragments if f != HOLE]
    if sum(len(f) for f in literal) < MIN_KEY:
        return None
    fragments = [f.strip(_EDGE) if f != HOLE else f for f in fragments]
    fragments = [
        f
        for i, f in enumerate(fragments)
        if f and not (f == HOLE and i and fragments[i - 1] in (HOLE, ""))
    ]
    while fragments and fragments[-1] == HOLE:
        fragments.pop()
    return " ".join(fragments)


def key_pattern(key: str) -> re.Pattern:
    """`key` (fragments joined by HOLE) as a regular expression."""
    return re.compile(".*?".join(re.escape(f.strip()) for f in key.split(HOLE)))


def module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    """The module-level names bound to string literals (message templates such as
    `MSG_FROZEN`), so that a module importing one can resolve it."""
    return {
        t.id: stmt.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, (ast.Constant, ast.JoinedStr))
        for t in stmt.targets
        if isinstance(t, ast.Name)
    }


def scan_source(source: str, file: str, constants: dict | None = None) -> list[Site]:
    """The exception sites of one module's source text. `constants`: message
    templates of other modules (`module_constants`), by name."""
    tree = ast.parse(source)
    scanner = _Scanner(file, tree, {**(constants or {}), **module_constants(tree)})
    scanner.visit(tree)
    return scanner.sites


def scan_tree(root: Path = SRC) -> list[Site]:
    sources = {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(root.rglob("*.py"))
    }
    constants: dict = {}
    for source in sources.values():
        constants.update(module_constants(ast.parse(source)))
    sites = []
    for file, source in sources.items():
        sites += scan_source(source, file, constants)
    return sites


def catalogue_entries(text: str) -> list[str]:
    """The rows of the catalogue's tables, normalised (header rows excluded)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|- :"):
            continue
        if line.replace(" ", "").startswith("|error|cause|fix|"):
            continue
        rows.append(normalise(line))
    return rows


def covers(entry: str, site: Site) -> bool:
    return (
        site.key is not None
        and site.exc in entry
        and key_pattern(site.key).search(entry) is not None
    )


def uncovered(sites: list[Site], entries: list[str], allowed: set) -> list[Site]:
    """The sites no catalogue entry covers and the allow-list does not excuse.
    `allowed` holds `(file, function, exc)` triples."""
    return [
        s
        for s in sites
        if (s.file, s.function, s.exc) not in allowed
        and not any(covers(e, s) for e in entries)
    ]


def stale_rows(entries: list[str], sites: list[Site], exempt: tuple) -> list[str]:
    """The rows that cover no site and do not start with one of `exempt`."""
    return [
        row
        for row in entries
        if not row.startswith(exempt) and not any(covers(row, s) for s in sites)
    ]


def error_cell(raw_row: str) -> str:
    """The first cell (the quoted messages) of a catalogue row, as written."""
    return raw_row.strip().strip("|").split(" | ")[0].strip()


def _bare(name: str) -> re.Pattern:
    """`name` where it is not inside backticks (nor part of a longer word)."""
    return re.compile(rf"(?<![\w`.]){re.escape(name)}(?![\w`])")


def dropped_backticks(raw_rows: list[str], sites: list[Site]) -> list[str]:
    """`row: name` for each name a message puts in backticks that a catalogue row
    covering it quotes without them (`summary: max_rows must ...` for the message
    ``summary: `max_rows` must ...``). Checked in each quoted message (code span)
    of the row's first cell that starts like the site's message."""
    found = []
    for raw in raw_rows:
        cell, entry = error_cell(raw), normalise(raw)
        covered = [s for s in sites if s.names and covers(entry, s)]
        for match in _SPAN.finditer(cell):
            span = match.group(1) or match.group(2)
            for site in covered:
                if not key_pattern(site.key or "").search(normalise(span)):
                    continue
                found += [
                    f"{cell[:70]}: {name}"
                    for name in site.names
                    if _bare(name).search(span) and f"`{name}`" not in span
                ]
    return sorted(set(found))


_SPAN = re.compile(r"``\s?(.+?)\s?``|`([^`]+)`")  # a code span, single or double
