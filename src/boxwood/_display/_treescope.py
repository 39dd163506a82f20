"""Modules in treescope: `Module.__treescope_repr__` (a module as its
constructor), and treescope's rendering in place of boxwood's HTML tree once
treescope is IPython's default renderer. boxwood never imports treescope or
IPython itself: both are read from `sys.modules`, where the user's setup put them.
"""

from __future__ import annotations

import sys
from typing import Any

from .._pretty import function_name
from ._walk import module_fields


class FunctionName:
    """A function as treescope shows it: the text every display gives it
    (`<function relu>`), with no address and no wrapper class."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        from treescope import rendering_parts

        del subtree_renderer
        text = rendering_parts.abbreviation_color(rendering_parts.text(self.text))
        return rendering_parts.build_one_line_tree_node(text, path)


def _function_or_value(x: Any) -> Any:
    name = function_name(x)
    return x if name is None else FunctionName(name)


def treescope_repr(module: Any, path: str | None, subtree_renderer: Any) -> Any:
    """`Module.__treescope_repr__`: a module as its constructor, one entry per
    field shown (see `_walk.py`), functions by name, coloured by class (treescope
    calls this when it is installed)."""
    from treescope import formatting_util, repr_lib

    attributes = {
        name: _function_or_value(value) for name, value, _ in module_fields(module)
    }
    return repr_lib.render_object_constructor(
        object_type=type(module),
        attributes=attributes,
        path=path,
        subtree_renderer=subtree_renderer,
        roundtrippable=False,
        color=formatting_util.color_from_string(type(module).__qualname__),
    )


def asked_by_treescope(depth: int) -> bool:
    """Whether the caller `depth` frames up is treescope's IPython renderer, which
    treescope registers as IPython's renderer of every object
    (`treescope.basic_interactive_setup()` or `register_as_default()`), and which
    takes an object's `_repr_html_`, when it has one, as the whole display.
    Rendering a module, treescope also asks it for the HTML view it attaches
    ("Rich HTML representation"): that one is boxwood's tree."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "treescope" not in sys.modules:
        return False
    shell = ipython.get_ipython()
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", {})
    printer = getattr(formatters.get("text/html"), "type_printers", {}).get(object)
    if not getattr(printer, "__module__", "").startswith("treescope."):
        return False
    return sys._getframe(depth + 1).f_code is getattr(printer, "__code__", None)


def treescope_html(module: Any) -> str:
    """Treescope's HTML rendering of `module`, as its IPython display gives it."""
    import treescope

    return treescope.render_to_html(module, ignore_exceptions=True, compressed=True)
