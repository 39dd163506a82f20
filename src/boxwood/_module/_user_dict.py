"""`module.__dict__` and `vars(module)`: the fields, and a write to them is a write to
the module.

A module's instance dict also holds boxwood's own entries: its static key (the
meta field JAX's flatten reads, `_register.REBUILD_NAME`) and, for a module that
`filter_jit` has seen, its flat form and what rests on it (`_flat_form.ENTRIES`).
Users see none of them: the
dict handed out is a copy of the instance dict without them, with the fields of a
module built from its flat form alone filled in first. Reading it changes nothing
and costs no cache.

Code written for plain objects also writes through `__dict__`
(`module.__dict__["w"] = w`, `vars(module).update(...)`). Each write to the copy is
made on the module too: during `__init__` straight into the instance dict, after
construction as any write after construction (`_field_descriptors.write_after_construction`:
the module's flat form and every flat form that rests on it are forgotten, and
a static field keeps the static key current). The copy is a snapshot: it does not
follow writes made to the module by other means after it was handed out.
"""

from __future__ import annotations

from typing import Any

from . import _flat_form
from ._construct import INITIALISING
from ._field_descriptors import DELETED, rekey, write_after_construction
from ._register import REBUILD_NAME
from ._slots import instance_dict

_HIDDEN = (REBUILD_NAME, *_flat_form.ENTRIES)


class FieldsDict(dict):
    """The dict `vars(module)` returns (see the module docstring). A `dict`, so
    `json.dumps`, `dict(...)`, `==` and `**` unpacking work as on any object's."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Any) -> None:
        _flat_form.fill(owner)
        super().__init__(
            (k, v) for k, v in instance_dict(owner).items() if k not in _HIDDEN
        )
        self._owner = owner

    def __setitem__(self, name: str, value: Any) -> None:
        _write(self._owner, name, value)
        dict.__setitem__(self, name, value)

    def __delitem__(self, name: str) -> None:
        dict.__delitem__(self, name)  # a `KeyError` for an absent name, as a dict
        _write(self._owner, name, DELETED)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def __ior__(self, other: Any) -> FieldsDict:
        self.update(other)
        return self

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return dict.__getitem__(self, name)

    def pop(self, name: str, *default: Any) -> Any:
        if name not in self:  # the default, or dict's own `KeyError`
            return dict.pop(self, name, *default)
        value = dict.__getitem__(self, name)
        del self[name]
        return value

    def popitem(self) -> tuple[str, Any]:
        if not self:
            return dict.popitem(self)  # dict's own `KeyError`
        name = next(reversed(self))
        return name, self.pop(name)

    def clear(self) -> None:
        for name in list(self):
            del self[name]

    def __reduce__(self) -> Any:  # pickled or copied: a plain dict of the fields
        return dict, (dict(self),)

    def copy(self) -> dict:
        return dict(self)


def _write(obj: Any, name: str, value: Any) -> None:
    """`obj.__dict__[name] = value` (`DELETED`: `del obj.__dict__[name]`), made on
    the module itself."""
    if name in _HIDDEN:
        raise ValueError(
            f"`{name}` is boxwood's own entry in a module's instance dict; it cannot "
            "be set or deleted through `vars(module)`."
        )
    if id(obj) in INITIALISING:
        values = instance_dict(obj)
        if value is DELETED:
            values.pop(name, None)
        else:
            values[name] = value
        return
    static = name in type(obj)._boxwood_static
    write_after_construction(obj, name, value, static)


def replace_fields(obj: Any, values: Any) -> None:
    """`obj.__dict__ = values`: the module's entries replaced by those of `values`
    (boxwood's own entries are kept, the static key made current), in place, as a
    write after construction unless `obj` is being initialised."""
    new = dict(values)
    for name in _HIDDEN:
        new.pop(name, None)
    initialising = id(obj) in INITIALISING
    own = instance_dict(obj) if initialising else _flat_form.forget(obj)
    for name in [k for k in own if k not in _HIDDEN]:
        del own[name]
    own.update(new)
    if not initialising:
        rekey(obj, own)
        _flat_form.written(obj)
