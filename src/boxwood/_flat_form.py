"""The flat form a module may carry: one owner, and the interface to it.

A module may keep its flattened form in its instance dict, under the key `FLAT`:
`(token, leaves)`, where `token.unflatten(leaves)` rebuilds the module. It is a
cache for `filter_jit`, which attaches it to module arguments seen twice
(`_jit/_flat_cache.py`, through `attach`) and to the modules its output builders
return (`_jit/_rebuild.py`, which may build an output module from its flat form
alone, leaving its fields to be filled in on first read). With it, a compiled call
takes a module without flattening it.

A module (`_module/`) knows nothing of who makes flat forms or why; it reaches
this file through these functions only:

- `flat_form(obj)`: the record, or `None`;
- `fill(obj)`: fill in the fields of a module built from its flat form alone
  (a field read that found nothing in the instance dict);
- `forget(obj)`: the module is being written to after construction (also
  through `vars(module)`): its fields are filled in, its flat form dropped, and the
  `DROPPED` hooks run, which forget every cached flat form and key that may rest
  on it (`_jit/_flat_cache.py` registers one);
- `drop(values)`: remove the flat form from an instance dict that nothing has seen
  yet (a module boxwood itself has just made);
- `state(obj)`: the instance dict without the flat form (pickling, copying).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._module._slots import instance_dict

FLAT = "_boxwood_flat"

# Called (with no argument) by `forget`: the invalidation of the fast-path keys and
# flat forms that may rest on a module that may have been written to.
DROPPED: list[Callable[[], None]] = []


def flat_form(obj: Any) -> Any:
    """`obj`'s flat form `(token, leaves)`, or `None`."""
    return instance_dict(obj).get(FLAT)


def attach(obj: Any, record: tuple) -> None:
    """Give `obj` the flat form `record` (`(token, leaves)`)."""
    instance_dict(obj)[FLAT] = record


def fill(obj: Any) -> None:
    """Fill in the fields of a module built from its flat form alone; a no-op for
    any other module."""
    values = instance_dict(obj)
    record = values.get(FLAT)
    if record is None or all(n in values for n in type(obj)._boxwood_data):
        return
    token, leaves = record
    full = token.unflatten(leaves)
    for name, value in instance_dict(full).items():
        values.setdefault(name, value)  # another thread may have been first


def forget(obj: Any) -> dict:
    """`obj` may be written to: fill in its fields, drop its flat form, and run
    the `DROPPED` hooks. **Returns** its instance dict."""
    values = instance_dict(obj)
    if FLAT in values:
        fill(obj)
        values.pop(FLAT, None)
    for hook in DROPPED:
        hook()
    return values


def drop(values: dict) -> None:
    """Remove the flat form from `values`, the instance dict of a module nothing
    has seen yet (so no cached key can rest on it)."""
    values.pop(FLAT, None)


def state(obj: Any) -> dict:
    """`obj`'s instance dict without its flat form, its fields filled in (a copy
    where there was a flat form to leave out)."""
    values = instance_dict(obj)
    if FLAT not in values:
        return values
    fill(obj)
    values = dict(values)
    del values[FLAT]
    return values
