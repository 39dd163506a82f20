"""At a first trace: arrays that methods of module arguments read from their
globals, fixed at the trace.

A method runs from its class, so what it reads from globals is fixed when the
function that calls it is traced. boxwood watches such reads in the classes it can
find from the function (`reads.py`: names the function reads, the callable given
to `filter_jit`) and keys the compiled code by them. The class of a module passed
as an *argument* is only known at the call: `warn_argument_methods` looks at those
classes when a function is traced and warns once per method and global, at that
first trace, that an array read there is fixed (naming the function, the method
and the global, and the fix). Classes of installed libraries (boxwood's own
layers, Equinox, diffrax, ...) are left alone: their module-level arrays are
constants by design.
"""

from __future__ import annotations

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
from ..._warnings import user_stacklevel
from .reads import Reads, class_functions, scan_code, unbound
from .values import (
    MISSING,
    MSG_ARGUMENT_METHOD,
    CapturedValueWarning,
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
    not one of an installed library or of boxwood."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path is None:  # `__main__` of a notebook or `python -c`
        return module is not None
    path = os.path.normcase(os.path.abspath(path))
    return not path.startswith(_LIBRARY_ROOTS)


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


def argument_reads(g: dict, args: tuple, kwargs: dict) -> dict[str, str]:
    """`{global name: method qualname}`: the globals in `g` that the methods of the
    module classes in `args` and `kwargs` read, for the classes defined with
    globals `g` (a notebook's, or a script's own classes), with the functions and
    classes those methods reach by name (`reads.Reads`, scanned once per class).
    They are watched and keyed like what the function's own methods read."""
    out: dict[str, str] = {}
    for cls in _module_classes((args, kwargs)):
        if _class_globals(cls) is not g:
            continue
        reads = _CLASS_READS.get(cls)
        if reads is None:
            reads = _CLASS_READS[cls] = dict(Reads(cls, g).unfollowed)
        for global_name, method in reads.items():
            out.setdefault(global_name, method)
    return out


def warn_argument_methods(
    name: str, args: tuple, kwargs: dict, keyed: dict | None = None
) -> None:
    """Warn (once per method and global) about the arrays read from globals by
    methods of the modules in `args` and `kwargs`, which function `name` is being
    traced with (`keyed`: globals watched and keyed instead, not warned about)."""
    for cls in _module_classes((args, kwargs)):
        for method, g, global_name in _global_reads(cls):
            if g is keyed:
                continue
            value = g.get(global_name, MISSING)
            if value is not MISSING and has_arrays(value):
                key = (cls.__module__, method, global_name)
                _warn_once(key, MSG_ARGUMENT_METHOD, value, name=name)
