"""The HTML tree of a module (`module_html`), which notebooks show for a module
that ends a cell (`notebook_html`, through `Module._repr_html_`)."""

from __future__ import annotations

import dataclasses
import functools
import html
from typing import Any

from .._finite import finite_report
from .._pretty import function_name
from ._treescope import asked_by_treescope, treescope_html
from ._walk import (
    FOLD_AT,
    FOLD_HEAD,
    REPR_LIMIT,
    LeafMemo,
    array_info,
    children,
    human_bytes,
    is_array,
    is_module,
    kinds,
    short_repr,
    type_label,
)

_STYLE = (
    "<style>.bw-tree{font-family:monospace;font-size:13px;line-height:1.45}"
    ".bw-tree details{margin-left:1.1em}.bw-tree>details{margin-left:0}"
    ".bw-tree summary{cursor:pointer}.bw-tree .bw-leaf{margin-left:2.2em}"
    ".bw-tree .bw-cls{font-weight:bold;color:#1f5fa8}.bw-tree .bw-stat{color:#777}"
    ".bw-tree .bw-static{color:#8a4b00}.bw-tree .bw-arr{color:#2b7a2b}"
    ".bw-tree .bw-head{color:#444;margin-bottom:.2em}</style>"
)


def notebook_html(module: Any) -> str:
    """`Module._repr_html_`: boxwood's HTML tree (`module_html`), or treescope's
    rendering when treescope's IPython renderer asks (once treescope is IPython's
    default renderer: `treescope.basic_interactive_setup()`)."""
    # the frames up: this function, `Module._repr_html_`, its caller
    if asked_by_treescope(depth=2):
        return treescope_html(module)
    return module_html(module)


def _stat_text(params: int, nbytes: int) -> str:
    return f"{params:,} params · {human_bytes(nbytes)}"


_escape = functools.lru_cache(maxsize=4096)(html.escape)  # bounded: names repeat


def _html_node(name: str, x: Any, depth: int, memo: LeafMemo) -> tuple[str, int, int]:
    """`(html, parameters, bytes)` for `x`, shown under the label `name`."""
    label = f"{_escape(name)}: " if name else ""
    if is_array(x):
        text, params, nbytes = array_info(x, memo)
        dtype = text.partition("[")[0]
        memo.dtype_bytes[dtype] = memo.dtype_bytes.get(dtype, 0) + nbytes
        return (
            f'<div class="bw-leaf">{label}<span class="bw-arr">{_escape(text)}</span></div>',
            params,
            nbytes,
        )
    parts = children(x, memo)
    if parts is None:
        return f'<div class="bw-leaf">{label}{html.escape(short_repr(x))}</div>', 0, 0
    if not parts:  # a module with nothing to show (an empty `StateIndex`)
        cls = f'<span class="bw-cls">{_escape(type_label(x))}</span>'
        return f'<div class="bw-leaf">{label}{cls}</div>', 0, 0
    body, params, nbytes = [], 0, 0
    shown = parts if len(parts) <= FOLD_AT else parts[:FOLD_HEAD]
    for key, value, static in shown:
        # a function held by a wrapper (nn.StaticFunction) shows as the function
        if static or function_name(value) is not None:
            if is_module(x, memo):
                names = memo.static.setdefault(type(x).__name__, [])
                if key not in names:
                    names.append(key)
            body.append(_html_static(key, value, memo))
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
        f'<summary>{label}<span class="bw-cls">{_escape(type_label(x))}</span> '
        f'<span class="bw-stat">{_stat_text(params, nbytes)}</span></summary>'
    )
    return f"<details{is_open}>{head}{''.join(body)}</details>", params, nbytes


def _static_fields(x: Any, memo: LeafMemo) -> list[tuple[str, Any]] | None:
    """The fields of a dataclass instance held as a static value (a model's
    config), keyword-only ones last (as its constructor takes them), or `None`."""
    if not dataclasses.is_dataclass(x) or isinstance(x, type) or is_module(x, memo):
        return None
    fields = dataclasses.fields(x)
    ordered = [f for f in fields if not f.kw_only] + [f for f in fields if f.kw_only]
    return [(f.name, getattr(x, f.name)) for f in ordered if f.repr]


def _html_static(key: str, value: Any, memo: LeafMemo) -> str:
    """A static field: its value's repr on one line, or, for a dataclass (a
    config), a closed entry with one line per field, so none is cut off."""
    name = _escape(key)
    fields = _static_fields(value, memo)
    if fields is None:
        return (
            f'<div class="bw-leaf">{name} = <span class="bw-static">'
            f"{html.escape(short_repr(value))}</span></div>"
        )
    lines = "".join(
        f'<div class="bw-leaf">{_escape(k)} = <span class="bw-static">'
        f"{html.escape(short_repr(v))}</span></div>"
        for k, v in fields
    )
    preview = ", ".join(f"{k}={short_repr(v, 24)}" for k, v in fields)
    text = short_repr(_Text(f"{type(value).__name__}({preview})"), 2 * REPR_LIMIT)
    head = f'{name} = <span class="bw-static">{html.escape(text)}</span>'
    return f"<details><summary>{head}</summary>{lines}</details>"


class _Text(str):
    """A string shown as itself (no quotes) by `short_repr`."""

    def __repr__(self) -> str:
        return str(self)


def _html_fold(parts: list, depth: int, memo: LeafMemo) -> tuple[str, int, int]:
    body, params, nbytes = [], 0, 0
    for key, value, _ in parts:
        piece, p, b = _html_node(key, value, depth, memo)
        body.append(piece)
        params, nbytes = params + p, nbytes + b
    what = _escape(kinds([value for _, value, _ in parts]))
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
    memo = LeafMemo()
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
