"""The flat form a module may carry: one owner, and the interface to it.

A module may keep its flattened form in its instance dict, under the key `FLAT`:
`(token, leaves)`, where `token.unflatten(leaves)` rebuilds the module. It is a
cache for `filter_jit`, which attaches it to module arguments seen twice
(`_flat_key.py`, through `attach`) and to the modules its output builders
return (`_flat_build.py`, which may build an output module from its flat form
alone, leaving its fields to be filled in on first read). With it, a compiled call
takes a module without flattening it.

A flat form rests on every module nested inside its owner. Each nested module
keeps, under `HOLDERS`, weak references to what rests on it: the modules whose
flat form holds its leaves, and any other object that asked (`rest_on`: a
`filter_jit` wrapper of a bound method keeps its module's arrays). A write to a
module after construction drops its own flat form and those of its holders, and
tells the other holders, and nothing else: every other module keeps its flat
form, and every fast-path key stays valid (a key names structures, never arrays).

The rest of `_module/` (the Module class, its fields and instance dict) knows
nothing of who makes flat forms or why; it reaches this file through these
functions only:

- `flat_form(obj)`: the record, or `None`;
- `fill(obj)`: fill in the fields of a module built from its flat form alone
  (a field read that found nothing in the instance dict);
- `forget(obj)`, then `written(obj)`: the module is being written to after
  construction (also through `vars(module)`): before the write, its fields are
  filled in and its flat form dropped; after it, the flat forms resting on it are
  dropped and its other holders told;
- `drop(values)`: remove the flat form from an instance dict that nothing has seen
  yet (a module boxwood itself has just made);
- `state(obj)`: the instance dict without boxwood's entries (pickling, copying).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ._register import MODULE_TYPES
from ._slots import instance_dict

FLAT = "_boxwood_flat"
# A module's list of `(weak reference, is_module)` to what rests on it
HOLDERS = "_boxwood_holders"
ENTRIES = (FLAT, HOLDERS)  # boxwood's own entries besides the static key
_PRUNE_AT = 64  # a holder list this long drops its dead references
# held while a holder list is changed or taken (slow paths only: never per call)
_HOLDERS_LOCK = threading.Lock()


def flat_form(obj: Any) -> Any:
    """`obj`'s flat form `(token, leaves)`, or `None`."""
    return instance_dict(obj).get(FLAT)


def attach(obj: Any, record: tuple) -> None:
    """Give `obj` the flat form `record` (`(token, leaves)`), and note it on the
    modules nested inside `obj`, whose writes must drop it."""
    instance_dict(obj)[FLAT] = record
    _hold(obj, True, _nested(instance_dict(obj)))


def rest_on(holder: Any, tree: Any) -> None:
    """`holder.forget_flat()` is to be called when a module inside `tree` (a
    module, or a tuple, list or dict holding modules) is written to after
    construction."""
    _hold(holder, False, _nested({None: tree}))


def _nested(values: dict) -> list:
    """The modules inside the values of an instance dict (through modules, tuples,
    lists and dicts; not static fields' values, which are in the structure)."""
    found = []
    stack = list(values.values())
    while stack:
        x = stack.pop()
        typ = type(x)
        if typ in MODULE_TYPES:
            found.append(x)
            own = instance_dict(x)
            stack.extend(own[n] for n in typ._boxwood_data if n in own)
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return found


def _hold(holder: Any, is_module: bool, modules: list) -> None:
    if not modules:
        return
    ref = (weakref.ref(holder), is_module)
    with _HOLDERS_LOCK:
        for module in modules:
            values = instance_dict(module)
            holders = values.get(HOLDERS)
            if holders is None:
                values[HOLDERS] = [ref]
                continue
            if len(holders) >= _PRUNE_AT:
                holders[:] = [h for h in holders if h[0]() is not None]
            holders.append(ref)


def fill(obj: Any) -> None:
    """Fill in the fields of a module built from its flat form alone; a no-op for
    any other module. The modules made for it carry `obj` as their holder."""
    values = instance_dict(obj)
    record = values.get(FLAT)
    if record is None or all(n in values for n in type(obj)._boxwood_data):
        return
    token, leaves = record
    full = token.unflatten(leaves)
    new = {}
    for name, value in instance_dict(full).items():
        if name not in values:
            new[name] = values.setdefault(name, value)  # another thread may be first
    _hold(obj, True, _nested(new))


def forget(obj: Any) -> dict:
    """`obj` is about to be written to: fill in its fields and drop its flat form.
    **Returns** its instance dict. Call `written(obj)` after the write."""
    values = instance_dict(obj)
    if FLAT in values:
        fill(obj)
        values.pop(FLAT, None)
    return values


def written(obj: Any) -> None:
    """`obj` was written to after construction: drop the flat forms resting on it
    and tell its other holders (`rest_on`), which may read it now."""
    with _HOLDERS_LOCK:
        holders = instance_dict(obj).pop(HOLDERS, ())
    for ref, is_module in holders:
        holder = ref()
        if holder is None:
            continue
        if is_module:
            instance_dict(holder).pop(FLAT, None)
        else:
            holder.forget_flat()


def drop(values: dict) -> None:
    """Remove the flat form from `values`, the instance dict of a module nothing
    has seen yet (so no cached key can rest on it)."""
    values.pop(FLAT, None)


def state(obj: Any) -> dict:
    """`obj`'s instance dict without boxwood's entries (its flat form and
    holders), its fields filled in (a copy where there was anything to leave
    out)."""
    values = instance_dict(obj)
    if FLAT not in values and HOLDERS not in values:
        return values
    fill(obj)
    return {k: v for k, v in values.items() if k not in ENTRIES}
