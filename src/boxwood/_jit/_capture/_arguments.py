"""The globals that methods of module arguments read.

A method runs from its class, so what it reads from globals is fixed when the
function that calls it is traced. boxwood watches such reads in the classes it can
find from the function (`_reads.py`: names the function reads, the callable given
to `filter_jit`) and keys the compiled code by them. The class of a module passed
as an *argument* is only known at the call: `argument_reads` gives what the
methods of those classes read, in the globals of the file or notebook that defined
each, to be watched and keyed the same way (`layer.Layer.watch_arguments`). Where
a callable cannot take that per-call check, `warn_argument_methods` warns once per
method and global, at the first trace, that an array read there is fixed. Classes
of installed libraries (boxwood's own layers, Equinox, diffrax, ...) are left
alone: their module-level values are constants by design.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
import types
import warnings
import weakref
from typing import Any

import jax

from ..._module import MODULE_TYPES
from ..._warnings import CapturedValueWarning, user_stacklevel
from ._reads import Reads, class_functions, scan_code, unbound
from ._values import (
    MISSING,
    MSG_ARGUMENT_METHOD,
    has_arrays,
    short,
)

# class -> `[(method qualname, globals, name)]`: its methods' global reads, scanned
# once per class (weakly: classes defined in a notebook cell come and go)
_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WARNED: set[tuple[str, str, str]] = set()  # (module, method qualname, name)
# class -> `{global name: method qualname}` its methods read (`argument_reads`)
_CLASS_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_LIBRARY_ROOTS = tuple(
    {
        os.path.normcase(sysconfig.get_paths()[kind]) + os.sep
        for kind in ("purelib", "platlib", "stdlib", "platstdlib")
    }
    | {os.path.normcase(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))}
)


def _user_class(cls: type) -> bool:
    """A class of the user's code: a script, a notebook, a package of their own;
    not one of an installed library (under the interpreter's site-packages, or a
    folder that packages are installed into, such as `pip install --target`'s)
    or of boxwood."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path is None:  # `__main__` of a notebook or `python -c`
        return module is not None
    path = os.path.normcase(os.path.abspath(path))
    if path.startswith(_LIBRARY_ROOTS):
        return False
    top = sys.modules.get(cls.__module__.partition(".")[0])
    top_path = getattr(top, "__file__", None) or path
    folder = os.path.dirname(os.path.abspath(top_path))
    if getattr(top, "__path__", None) is not None:  # a package: its parent folder
        folder = os.path.dirname(folder)
    return not _holds_installed(folder)


@functools.lru_cache(maxsize=256)
def _holds_installed(folder: str) -> bool:
    """Whether packages are installed into `folder` (it holds `*.dist-info`)."""
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(folder))
    except OSError:
        return False


def _global_reads(cls: type) -> list[tuple[str, dict, str]]:
    found = _READS.get(cls)
    if found is None:
        found = []
        module = sys.modules.get(cls.__module__)
        g = getattr(module, "__dict__", None)
        if type(g) is dict and _user_class(cls):
            for fun in class_functions(cls, g):
                code = getattr(fun, "__code__", None)
                if code is None or getattr(fun, "__globals__", None) is not g:
                    continue
                for name in scan_code(code)[0]:
                    found.append((fun.__qualname__, g, name))
        _READS[cls] = found
    return found


def _module_classes(tree: Any) -> list[type]:
    """The module classes in `tree`, from its structure (no leaf is looked at)."""
    classes: dict[type, None] = {}
    stack = [jax.tree_util.tree_structure(tree)]
    while stack:
        treedef = stack.pop()
        data = treedef.node_data()
        if data is None:  # a leaf
            continue
        typ = data[0]
        if typ in MODULE_TYPES:
            classes[typ] = None
        stack.extend(treedef.children())
    return list(classes)


def _warn_once(key: tuple[str, str, str], template: str, value: Any, **more: str):
    """Warn, once per process for each `(module, method, global)`, that the global
    read inside the method holds `value`, fixed at the trace (`more`: the template's
    other fields)."""
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(
        template.format(
            label=f"global {key[2]!r}", value=short(value), via=f"`{key[1]}`", **more
        ),
        CapturedValueWarning,
        stacklevel=user_stacklevel(),
    )


def _class_globals(cls: type) -> dict | None:
    """The globals of the functions a class defines (those of the file or
    notebook that defined it), or `None` when it defines none."""
    for name, item in vars(cls).items():
        # (protocol methods may be generated elsewhere: a dataclass's `__init__`)
        if name.startswith("__") and name != "__call__":
            continue
        item = unbound(item, cls)
        if type(item) is types.FunctionType:
            return item.__globals__
    return None


def argument_reads(args: tuple, kwargs: dict) -> dict[tuple[int, str], tuple]:
    """`{(id(globals), name): (globals, method qualname)}`: the globals that the
    methods of the module classes in `args` and `kwargs` read (with the functions
    and classes those methods reach by name: `reads.Reads`, scanned once per
    class), in the globals of the file or notebook that defined each class, for
    the classes of the user's code (`_user_class`). They are watched and keyed
    like what the function's own methods read."""
    out: dict[tuple[int, str], tuple] = {}
    for cls in _module_classes((args, kwargs)):
        reads = _CLASS_READS.get(cls)
        if reads is None:
            g = _class_globals(cls)
            found = {}
            if g is not None and _user_class(cls):
                found = {
                    (id(g), n): (g, m) for n, m in Reads(cls, g).unfollowed.items()
                }
            reads = _CLASS_READS[cls] = found
        for key, value in reads.items():
            out.setdefault(key, value)
    return out


def warn_argument_methods(name: str, args: tuple, kwargs: dict) -> None:
    """Warn (once per method and global) about the arrays read from globals by
    methods of the modules in `args` and `kwargs`, which `name` is being traced
    with: for a callable that cannot take the per-call check (one that is not a
    plain function, and reads nothing watched itself)."""
    for cls in _module_classes((args, kwargs)):
        for method, g, global_name in _global_reads(cls):
            value = g.get(global_name, MISSING)
            if value is not MISSING and has_arrays(value):
                key = (cls.__module__, method, global_name)
                _warn_once(key, MSG_ARGUMENT_METHOD, value, name=name)
