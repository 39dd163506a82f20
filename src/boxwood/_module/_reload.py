"""Module classes under IPython's `%autoreload`.

`%autoreload 2` runs an edited file again and then patches each old class in
place from its new version, so that objects made before the edit run the new
code. Its generic class patch reads every attribute of the old class, and a
Module class holds a descriptor for each field, which a required field answers
with `AttributeError` on the class (as a dataclass does): the patch stopped there
("Failed to reload module"), half done.

So, once the extension is loaded, Module classes get a rule of their own, ahead of
the extension's: `install` puts it there, and is called each time a Module class
is made (cheap: a dict lookup), so it is in place before the reload's patch of the
classes it has just made again. The rule (`_update`):

- patches each method's function in place (the new code runs through every
  reference to the old function: bound methods, wrappers of it), and replaces or
  removes the class's other attributes; fields stay as the old class has them;
- moves the old class's instances to the new class when both have the same fields
  (so `isinstance(model, mymodule.Model)` holds, as for any reloaded class), with
  their static keys and flat forms renewed as after a write;
- empties boxwood's compiled programs, so that a compiled call of an old or a new
  instance runs the edited code (it is traced again).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from . import _flat_form
from ._register import REBUILD_NAME
from ._slots import instance_dict
from ._static_key import key

_EXTENSION = "IPython.extensions.autoreload"
# what a class holds that is the class's own machinery, never patched from the new one
_KEEP = frozenset(
    {
        "__dict__", "__weakref__", "__dataclass_fields__", "__dataclass_params__",
        "__match_args__", "__abstractmethods__", "_abc_impl", "__annotations__",
        "__parameters__", "__orig_bases__", "__signature__",
    }
)  # fmt: skip


def install(method: type) -> None:
    """Put boxwood's rule first among the extension's, if it is loaded and the
    rule is not there yet. `method` is the type of a Module class's methods."""
    extension = sys.modules.get(_EXTENSION)
    rules = getattr(extension, "UPDATE_RULES", None)
    if not isinstance(rules, list) or any(rule[1] is _update for rule in rules):
        return
    _METHOD[:] = [method]
    rules.insert(0, (_both_modules, _update))


_METHOD: list[type] = []  # the type of Module methods, given to `install`


def _both_modules(old: Any, new: Any) -> bool:
    # classes that `_module.py`'s metaclass finished (it marks each)
    return all(
        isinstance(c, type) and c.__dict__.get("_boxwood_built") is c
        for c in (old, new)
    )


def _update(old: Any, new: Any) -> None:
    """Patch `old`, a Module class, from `new`, its reloaded version."""
    method = _METHOD[0]
    extension = sys.modules[_EXTENSION]
    fields = old._boxwood_field_names | new._boxwood_field_names
    names = [*old.__dict__, *(n for n in new.__dict__ if n not in old.__dict__)]
    for name in names:
        if name in _KEEP or name in fields or name.startswith("_boxwood_"):
            continue
        if name not in new.__dict__:
            type.__delattr__(old, name)
            continue
        was, now = old.__dict__.get(name), new.__dict__[name]
        if isinstance(was, method) and isinstance(now, method):
            extension.update_generic(was.func, now.func)
        elif was is None or not extension.update_generic(was, now):
            try:
                type.__setattr__(old, name, now)
            except (AttributeError, TypeError):  # not writable: as the extension
                pass
    if _same_layout(old, new):
        _move_instances(old, new)
    from .._caches import clear_caches

    clear_caches()


def _same_layout(old: Any, new: Any) -> bool:
    return (old._boxwood_data, old._boxwood_static) == (
        new._boxwood_data,
        new._boxwood_static,
    ) and not (old._boxwood_slots or new._boxwood_slots)


def _move_instances(old: Any, new: Any) -> None:
    for obj in gc.get_referrers(old):
        if type(obj) is not old:
            continue
        _flat_form.forget(obj)
        object.__setattr__(obj, "__class__", new)
        values = instance_dict(obj)
        values[REBUILD_NAME] = key(new, values)
        _flat_form.written(obj)
