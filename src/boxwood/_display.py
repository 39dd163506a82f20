"""Rich display of modules: `Module._repr_html_` (a collapsible tree for notebooks)
and `boxwood.summary` (a table of submodules, as text or HTML).

Both walk the model once, in the order JAX flattens it, and name things with the
dotted paths of `_paths.py`. Parameters are the elements of floating-point arrays;
sizes are the bytes of all arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._finite import FiniteReport, finite_report
from ._module import Module
from ._module._register import MODULE_TYPES
from ._pretty import array_summary, function_name
from .nn._state import StateIndex

FOLD_AT = 16  # sequences longer than this show their first FOLD_HEAD items ...
FOLD_HEAD = 8  # ... and fold the rest under one collapsed line
_REPR_LIMIT = 80  # characters of a static value's repr

_STYLE = (
    "<style>.bw-tree{font-family:monospace;font-size:13px;line-height:1.45}"
    ".bw-tree details{margin-left:1.1em}.bw-tree>details{margin-left:0}"
    ".bw-tree summary{cursor:pointer}.bw-tree .bw-leaf{margin-left:2.2em}"
    ".bw-tree .bw-cls{font-weight:bold;color:#1f5fa8}.bw-tree .bw-stat{color:#777}"
    ".bw-tree .bw-static{color:#8a4b00}.bw-tree .bw-arr{color:#2b7a2b}"
    ".bw-tree .bw-head{color:#444;margin-bottom:.2em}</style>"
)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class _LeafMemo(dict):
    """Per-walk memo of `(summary text, parameters, bytes)` by array type, dtype
    and shape (a large model has thousands of leaves but few distinct kinds of
    array), and what the HTML tree's first lines report: bytes per dtype and the
    static fields of each class."""

    def __init__(self) -> None:
        super().__init__()
        self.dtype_bytes: dict[str, int] = {}
        self.static: dict[str, list[str]] = {}


def _array_info(x: Any, memo: _LeafMemo) -> tuple[str, int, int]:
    """`(f32[4,3], parameters, bytes)` of one array."""
    key = (type(x), x.dtype, x.shape)
    found = memo.get(key)
    if found is None:
        size = int(np.prod(x.shape, dtype=np.int64))
        inexact = jnp.issubdtype(x.dtype, jnp.inexact)  # bfloat16 too
        found = (array_summary(x), size if inexact else 0, size * x.dtype.itemsize)
        memo[key] = found
    return found


def human_bytes(n: float) -> str:
    """`1536` -> `'1.5 KiB'`.

    >>> human_bytes(512), human_bytes(1536), human_bytes(3 * 2**20)
    ('512 B', '1.5 KiB', '3.0 MiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# `<Foo object at 0x7f...>`: the address differs between runs and says nothing
_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


def _short_repr(x: Any, limit: int = _REPR_LIMIT) -> str:
    text = _ADDRESS.sub("", function_name(x) or repr(x))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _children(x: Any) -> list[tuple[str, Any, bool]] | None:
    """`(name, value, is_static)` for the parts of a container or module, or `None`
    for a leaf. Names are the parts of the dotted paths of `_paths.py`: field
    names, sequence indices and `str(dict key)`. A `StateIndex` shows only its
    initial value (if any): its marker is the state's internal key."""
    if isinstance(x, StateIndex):
        return [] if x.init is None else [("init", x.init, False)]
    if type(x) in MODULE_TYPES or isinstance(x, Module):
        static = type(x)._boxwood_static
        return [
            (f.name, getattr(x, f.name), f.name in static)
            for f in type(x)._boxwood_fields
        ]
    fields = getattr(x, "_fields", None)
    if isinstance(x, tuple) and fields is not None:  # NamedTuple
        return [(k, v, False) for k, v in zip(fields, x)]
    if isinstance(x, (list, tuple)):
        return [(str(i), v, False) for i, v in enumerate(x)]
    if isinstance(x, dict):
        return [(str(k), v, False) for k, v in x.items()]
    return None


def _type_label(x: Any) -> str:
    if isinstance(x, (list, tuple, dict)) and not hasattr(x, "_fields"):
        return f"{type(x).__name__}[{len(x)}]"
    return type(x).__name__


# ---------------------------------------------------------------- HTML tree


def _stat_text(params: int, nbytes: int) -> str:
    return f"{params:,} params · {human_bytes(nbytes)}"


_escape = functools.lru_cache(maxsize=4096)(html.escape)  # bounded: names repeat


def _html_node(name: str, x: Any, depth: int, memo: _LeafMemo) -> tuple[str, int, int]:
    """`(html, parameters, bytes)` for `x`, shown under the label `name`."""
    label = f"{_escape(name)}: " if name else ""
    if _is_array(x):
        text, params, nbytes = _array_info(x, memo)
        dtype = text.partition("[")[0]
        memo.dtype_bytes[dtype] = memo.dtype_bytes.get(dtype, 0) + nbytes
        return (
            f'<div class="bw-leaf">{label}<span class="bw-arr">{_escape(text)}</span></div>',
            params,
            nbytes,
        )
    parts = _children(x)
    if parts is None:
        return f'<div class="bw-leaf">{label}{html.escape(_short_repr(x))}</div>', 0, 0
    if not parts:  # a module with nothing to show (an empty `StateIndex`)
        cls = f'<span class="bw-cls">{_escape(_type_label(x))}</span>'
        return f'<div class="bw-leaf">{label}{cls}</div>', 0, 0
    body, params, nbytes = [], 0, 0
    shown = parts if len(parts) <= FOLD_AT else parts[:FOLD_HEAD]
    for key, value, static in shown:
        # a function held by a wrapper (nn.StaticFunction) shows as the function
        if static or function_name(value) is not None:
            if isinstance(x, Module):
                names = memo.static.setdefault(type(x).__name__, [])
                if key not in names:
                    names.append(key)
            body.append(_html_static(key, value))
            continue
        piece, p, b = _html_node(key, value, depth + 1, memo)
        body.append(piece)
        params, nbytes = params + p, nbytes + b
    if len(parts) > FOLD_AT:
        folded, p, b = _html_fold(parts[FOLD_HEAD:], depth + 1, memo)
        body.append(folded)
        params, nbytes = params + p, nbytes + b
    is_open = " open" if depth == 0 else ""
    head = (
        f'<summary>{label}<span class="bw-cls">{_escape(_type_label(x))}</span> '
        f'<span class="bw-stat">{_stat_text(params, nbytes)}</span></summary>'
    )
    return f"<details{is_open}>{head}{''.join(body)}</details>", params, nbytes


def _static_fields(x: Any) -> list[tuple[str, Any]] | None:
    """The fields of a dataclass instance held as a static value (a model's
    config), keyword-only ones last (as its constructor takes them), or `None`."""
    if not dataclasses.is_dataclass(x) or isinstance(x, (type, Module)):
        return None
    fields = dataclasses.fields(x)
    ordered = [f for f in fields if not f.kw_only] + [f for f in fields if f.kw_only]
    return [(f.name, getattr(x, f.name)) for f in ordered if f.repr]


def _html_static(key: str, value: Any) -> str:
    """A static field: its value's repr on one line, or, for a dataclass (a
    config), a closed entry with one line per field, so none is cut off."""
    name = _escape(key)
    fields = _static_fields(value)
    if fields is None:
        return (
            f'<div class="bw-leaf">{name} = <span class="bw-static">'
            f"{html.escape(_short_repr(value))}</span></div>"
        )
    lines = "".join(
        f'<div class="bw-leaf">{_escape(k)} = <span class="bw-static">'
        f"{html.escape(_short_repr(v))}</span></div>"
        for k, v in fields
    )
    preview = ", ".join(f"{k}={_short_repr(v, 24)}" for k, v in fields)
    text = _short_repr(_Text(f"{type(value).__name__}({preview})"), 2 * _REPR_LIMIT)
    head = f'{name} = <span class="bw-static">{html.escape(text)}</span>'
    return f"<details><summary>{head}</summary>{lines}</details>"


class _Text(str):
    """A string shown as itself (no quotes) by `_short_repr`."""

    def __repr__(self) -> str:
        return str(self)


def _html_fold(parts: list, depth: int, memo: _LeafMemo) -> tuple[str, int, int]:
    body, params, nbytes = [], 0, 0
    kinds: dict[str, int] = {}
    for key, value, _ in parts:
        piece, p, b = _html_node(key, value, depth, memo)
        body.append(piece)
        params, nbytes = params + p, nbytes + b
        kind = _type_label(value)
        kinds[kind] = kinds.get(kind, 0) + 1
    what = ", ".join(f"{n} × {_escape(k)}" for k, n in kinds.items())
    head = (
        f'<summary class="bw-fold">… {len(parts)} more ({what}) '
        f'<span class="bw-stat">{_stat_text(params, nbytes)}</span></summary>'
    )
    return f"<details>{head}{''.join(body)}</details>", params, nbytes


def module_html(tree: Any, *, check_finite: bool | None = None) -> str:
    """An HTML tree of `tree`: one collapsible entry per module and container (the
    root open, the rest closed), with class names, static fields, each array's
    dtype and shape, and the parameters and bytes below each entry. Sequences longer
    than 16 show 8 items and fold the rest under one line. No JavaScript: the
    entries are `<details>` elements.

    First come the totals: parameters, bytes per dtype, the static fields of each
    class, and whether an array holds NaN or Inf (see `_finite.py`: checked when
    cheap or when `check_finite=True`, never when `False`).

    `Module._repr_html_` returns this, so notebooks show it for a module.

    **Arguments:**

    - `tree`: a module or any pytree.
    - `check_finite`: read the arrays for NaN and Inf (`None`: only when cheap).

    **Returns:**

    A self-contained HTML fragment (`str`).
    """
    memo = _LeafMemo()
    node, params, nbytes = _html_node("", tree, 0, memo)
    head = _escape(overview(params, nbytes, memo.dtype_bytes))
    static = "; ".join(
        f"{cls}: {', '.join(names)}" for cls, names in memo.static.items()
    )
    lines = [head, f"static fields: {_escape(static)}" if static else ""]
    lines.append(_escape(finite_report(tree, check_finite).text()))
    heads = "".join(f'<div class="bw-head">{line}</div>' for line in lines if line)
    return f'{_STYLE}<div class="bw-tree">{heads}{node}</div>'


def overview(params: int, nbytes: int, dtype_bytes: dict[str, int]) -> str:
    """`17 params, 68 B (f32 68 B)`: the totals and the bytes of each dtype."""
    per_dtype = ", ".join(f"{d} {human_bytes(b)}" for d, b in dtype_bytes.items())
    text = f"{params:,} params, {human_bytes(nbytes)}"
    return f"{text} ({per_dtype})" if per_dtype else text


# ---------------------------------------------------------------- summary table


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One submodule in a `Summary`: its dotted path, class name, the dtypes and
    shapes of its own arrays, and the parameters and bytes of its whole subtree."""

    path: str
    type: str
    depth: int
    shapes: str
    params: int
    nbytes: int


def _rows(
    path: str, x: Any, depth: int, rows: list, memo: _LeafMemo
) -> tuple[int, int]:
    if _is_array(x):
        _, params, nbytes = _array_info(x, memo)
        return params, nbytes
    parts = _children(x)
    if parts is None:
        return 0, 0
    # A module may opt out of its own row (a wrapper such as nn.StaticFunction, which
    # holds a plain function and no arrays, is configuration, not a layer).
    has_row = depth == 0 or (
        isinstance(x, Module) and getattr(type(x), "__boxwood_summary_row__", True)
    )
    index = len(rows)
    if has_row:
        rows.append(None)  # filled in below, once the subtree is counted
    params = nbytes = 0
    own = []
    for key, value, static in parts:
        if static:
            continue
        if _is_array(value):
            own.append(f"{key} {_array_info(value, memo)[0]}")
        child_path = f"{path}.{key}" if path else key
        p, b = _rows(child_path, value, depth + has_row, rows, memo)
        params, nbytes = params + p, nbytes + b
    if has_row:
        shapes = ", ".join(own)
        rows[index] = SummaryRow(
            path or "(root)", _type_label(x), depth, shapes, params, nbytes
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
    Print it for text, or leave it as a notebook cell's value for an HTML table.

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
    _rows("", model, 0, rows, _LeafMemo())
    finite = finite_report(model, True) if check_finite else None
    return Summary(rows, max_rows, finite)


# ---------------------------------------------------------------- treescope


class _FunctionName:
    """Shown by treescope as its text: a function named as every display names it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _function_or_value(x: Any) -> Any:
    name = function_name(x)
    return x if name is None else _FunctionName(name)


def treescope_repr(module: Module, path: str | None, subtree_renderer: Any) -> Any:
    """`Module.__treescope_repr__`: a module as its constructor, one entry per
    field, coloured by class (treescope calls this when it is installed; boxwood
    never imports treescope itself)."""
    from treescope import formatting_util, repr_lib

    hidden = {"marker"} if isinstance(module, StateIndex) else set()  # internal key
    attributes = {
        f.name: _function_or_value(getattr(module, f.name))
        for f in dataclasses.fields(module)
        if f.name not in hidden
    }
    return repr_lib.render_object_constructor(
        object_type=type(module),
        attributes=attributes,
        path=path,
        subtree_renderer=subtree_renderer,
        roundtrippable=False,
        color=formatting_util.color_from_string(type(module).__qualname__),
    )


def _module_repr_html(self: Module) -> str:
    """`Module._repr_html_`: notebooks show a collapsible tree (`module_html`)."""
    return module_html(self)


def _module_treescope_repr(self: Module, path: Any, subtree_renderer: Any) -> Any:
    """`Module.__treescope_repr__`: treescope (an optional extra) calls this."""
    return treescope_repr(self, path, subtree_renderer)


# Registered here, at import of the package (`boxwood/__init__.py` imports this
# module), so that `_module` never imports display code.
type.__setattr__(Module, "_repr_html_", _module_repr_html)
type.__setattr__(Module, "__treescope_repr__", _module_treescope_repr)
