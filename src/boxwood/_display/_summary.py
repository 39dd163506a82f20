"""`boxwood.summary`: a table of a model's submodules, as text or HTML."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from .._finite import FiniteReport, finite_report
from ._walk import (
    FOLD_AT,
    FOLD_HEAD,
    LeafMemo,
    array_info,
    children,
    human_bytes,
    is_array,
    is_module,
    kinds,
    type_label,
)


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One submodule in a `Summary`: its dotted path, class name, the dtypes and
    shapes of its own arrays, and the parameters and bytes of its whole subtree.

    A long list of layers is folded as the HTML tree folds it: after its first 8
    entries, one row stands for the rest (`layers.8 … layers.99`, type
    `92 × Linear`), with `folded` the number of entries it stands for (0 for the
    row of one module)."""

    path: str
    type: str
    depth: int
    shapes: str
    params: int
    nbytes: int
    folded: int = 0


def _has_row(x: Any, depth: int, memo: LeafMemo) -> bool:
    # A module may opt out of its own row (a wrapper such as nn.StaticFunction, which
    # holds a plain function and no arrays, is configuration, not a layer).
    return depth == 0 or (
        is_module(x, memo) and getattr(type(x), "__boxwood_summary_row__", True)
    )


def _rows(path: str, x: Any, depth: int, rows: list, memo: LeafMemo) -> tuple[int, int]:
    if is_array(x):
        _, params, nbytes = array_info(x, memo)
        return params, nbytes
    parts = children(x, memo)
    if parts is None:
        return 0, 0
    has_row = _has_row(x, depth, memo)
    index = len(rows)
    if has_row:
        rows.append(None)  # filled in below, once the subtree is counted
    own = [
        f"{k} {array_info(v, memo)[0]}" for k, v, s in parts if is_array(v) and not s
    ]
    shown = parts if len(parts) <= FOLD_AT else parts[:FOLD_HEAD]
    params, nbytes = _children_rows(path, shown, depth + has_row, rows, memo)
    if len(parts) > FOLD_AT:
        p, b = _fold(path, parts[FOLD_HEAD:], depth + has_row, rows, memo)
        params, nbytes = params + p, nbytes + b
    if has_row:
        rows[index] = SummaryRow(
            path or "(root)", type_label(x), depth, ", ".join(own), params, nbytes
        )
    return params, nbytes


def _children_rows(
    path: str, parts: list, depth: int, rows: list, memo: LeafMemo
) -> tuple[int, int]:
    params = nbytes = 0
    for key, value, static in parts:
        if not static:
            child_path = f"{path}.{key}" if path else key
            p, b = _rows(child_path, value, depth, rows, memo)
            params, nbytes = params + p, nbytes + b
    return params, nbytes


def _fold(
    path: str, parts: list, depth: int, rows: list, memo: LeafMemo
) -> tuple[int, int]:
    """The entries of a long sequence after its first 8, counted and shown as one
    row (if they hold modules; arrays alone are only counted)."""
    folded: list = []
    params, nbytes = _children_rows(path, parts, depth, folded, memo)
    if folded:
        first, last = (
            f"{path}.{k}" if path else k for k in (parts[0][0], parts[-1][0])
        )
        what = kinds([value for _, value, _ in parts])
        rows.append(
            SummaryRow(f"{first} … {last}", what, depth, "", params, nbytes, len(parts))
        )
    return params, nbytes


class Summary:
    """The table that [`boxwood.summary`][] returns: `str()` gives text, and
    notebooks show `_repr_html_()`. `rows` holds one `SummaryRow` per module."""

    def __init__(
        self, rows: list[SummaryRow], max_rows: int, finite: FiniteReport | None = None
    ) -> None:
        self.rows = rows
        self.max_rows = max_rows
        self.finite = finite  # set by summary(..., check_finite=True)
        self.params = rows[0].params if rows else 0
        self.nbytes = rows[0].nbytes if rows else 0

    def _shown(self) -> tuple[list[SummaryRow], int]:
        if len(self.rows) <= self.max_rows:
            return self.rows, 0
        return self.rows[: self.max_rows], len(self.rows) - self.max_rows

    def __str__(self) -> str:
        shown, hidden = self._shown()
        table = [("module", "type", "params", "size", "arrays")]
        for r in shown:
            name = "  " * r.depth + r.path
            table.append(
                (name, r.type, f"{r.params:,}", human_bytes(r.nbytes), r.shapes)
            )
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        lines = [
            "  ".join(
                c.ljust(w) if i != 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            )
            + ("  " + row[4] if row[4] else "")
            for row in table
        ]
        lines.insert(1, "-" * len(lines[0]))
        if hidden:
            lines.append(
                f"... {hidden} more modules (summary(model, max_rows=...) shows more)"
            )
        lines.append(f"total: {self.params:,} params, {human_bytes(self.nbytes)}")
        if self.finite is not None:
            lines.append(self.finite.text())
        return "\n".join(line.rstrip() for line in lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        shown, hidden = self._shown()
        cells = "".join(
            f"<tr><td style='padding-left:{0.3 + 1.2 * r.depth:.1f}em'>{html.escape(r.path)}"
            f"</td><td>{html.escape(r.type)}</td><td style='text-align:right'>{r.params:,}"
            f"</td><td style='text-align:right'>{human_bytes(r.nbytes)}</td>"
            f"<td>{html.escape(r.shapes)}</td></tr>"
            for r in shown
        )
        more = f"<tr><td colspan=5>… {hidden} more modules</td></tr>" if hidden else ""
        finite = (
            f"<tr><td colspan=5>{html.escape(self.finite.text())}</td></tr>"
            if self.finite is not None
            else ""
        )
        return (
            "<table class='bw-summary' style='font-family:monospace'><thead><tr>"
            "<th>module</th><th>type</th><th>params</th><th>size</th><th>arrays</th>"
            f"</tr></thead><tbody>{cells}{more}</tbody><tfoot><tr><td colspan=5>"
            f"total: {self.params:,} params, {human_bytes(self.nbytes)}</td></tr>"
            f"{finite}</tfoot></table>"
        )


def summary(model: Any, *, max_rows: int = 200, check_finite: bool = False) -> Summary:
    """A table of the submodules of `model`: dotted path, class, parameter count,
    size in bytes and the dtypes and shapes of each module's own arrays.

    Parameters are the elements of floating-point arrays; sizes count every array.
    A sequence of more than 16 layers shows its first 8 and one row for the rest
    (`layers.8 … layers.99  92 × Linear`), as the notebook tree folds it. Print it
    for text, or leave it as a notebook cell's value for an HTML table.

    **Arguments:**

    - `model`: a module, or any pytree of modules (a tuple or dict of several).
    - `max_rows`: the most rows shown; the rest are counted in one line.
    - `check_finite`: also read every floating-point array and report the ones
        holding NaN or Inf, by path, in a last line (this waits for the arrays to
        be computed and copies them to the host).

    **Returns:**

    A `Summary` (`str()` for text, `_repr_html_()` for HTML; `.rows`, `.params`,
    `.nbytes` for programs).

    >>> import jax, boxwood
    >>> model = boxwood.nn.MLP(2, 1, width_size=4, depth=1, key=jax.random.key(0))
    >>> print(boxwood.summary(model))  # doctest: +NORMALIZE_WHITESPACE
    module      type    params  size   arrays
    ----------------------------------------
    (root)      MLP         17  68 B
      layers.0  Linear      12  48 B  weight f32[4,2], bias f32[4]
      layers.1  Linear       5  20 B  weight f32[1,4], bias f32[1]
    total: 17 params, 68 B
    """
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(
            f"summary: `max_rows` must be a positive int, got {max_rows!r}."
        )
    if not isinstance(check_finite, bool):
        raise TypeError(
            f"summary: `check_finite` must be True or False, got {check_finite!r}."
        )
    rows: list[SummaryRow] = []
    _rows("", model, 0, rows, LeafMemo())
    finite = finite_report(model, True) if check_finite else None
    return Summary(rows, max_rows, finite)
