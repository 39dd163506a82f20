"""The class attributes of modules' fields.

`_Field` is the class attribute of every field: a data descriptor, so that every
write reaches boxwood, also one that bypasses `Module.__setattr__`. A field read
that finds nothing in the instance dict fills in a module built from its flat form
alone, and a write after construction forgets the module's flat form, both through
`boxwood/_module/_flat_form.py`, the one owner of flat forms. The instance dict itself is
reached through its slot (`_slots.py`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from . import _flat_form, _static_key
from ._construct import INITIALISING
from ._field import is_static
from ._register import REBUILD_NAME
from ._slots import instance_dict


class _Field:
    """The class attribute of a field: reads, defaults, lazy fields, and writes that
    bypass `Module.__setattr__`. A data descriptor, so that every write reaches
    `_write`, also one that bypasses `Module.__setattr__`.

    - **Reads** return the instance dict's value.
    - **A field missing from the instance dict**: either a default read on the class
      (`Cls.field`), a field not set yet during `__init__`, or a data field of a
      module built by `filter_jit` with its flat form only (`_flat_build.py`: a
      training step's outputs usually go straight into the next step, so their
      nested modules are only built when something reads them). Then the fields are
      rebuilt from the flat form, once.
    - **Writes** during construction go to the instance dict. A write after
      construction (`object.__setattr__(module, name, value)`, which Equinox code
      sometimes uses; a subclass's own `__setattr__`) is seen by the next call of
      every `filter_jit` function: see `write_after_construction`.
    """

    __slots__ = ("name", "default", "static")

    def __init__(self, name: str, default: Any, static: bool) -> None:
        self.name = name
        self.default = default
        self.static = static

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is not None:
            try:
                return instance_dict(obj)[self.name]
            except KeyError:
                pass
        return self._missing(obj, owner)

    def __set__(self, obj: Any, value: Any) -> None:
        self._write(obj, value)

    def __delete__(self, obj: Any) -> None:
        self._delete(obj)

    def _missing(self, obj: Any, owner: Any) -> Any:
        if obj is None:  # `Cls.field`: the default, as on a dataclass
            if self.default is dataclasses.MISSING:
                raise AttributeError(
                    f"type object {owner.__name__!r} has no attribute {self.name!r}"
                )
            return self.default
        if _flat_form.flat_form(obj) is None:
            raise AttributeError(
                f"{type(obj).__name__!r} object has no attribute {self.name!r}",
                name=self.name,
                obj=obj,
            )
        _flat_form.fill(obj)
        return instance_dict(obj)[self.name]

    def _write(self, obj: Any, value: Any) -> None:
        if id(obj) in INITIALISING:
            instance_dict(obj)[self.name] = value
        else:
            write_after_construction(obj, self.name, value, self.static)

    def _delete(self, obj: Any) -> None:
        values = instance_dict(obj)
        if self.name not in values and _flat_form.flat_form(obj) is None:
            raise AttributeError(
                f"{type(obj).__name__!r} object has no attribute {self.name!r}",
                name=self.name,
                obj=obj,
            )
        write_after_construction(obj, self.name, DELETED, self.static)


#: The value of `write_after_construction` that deletes the field.
DELETED = object()


def write_after_construction(obj: Any, name: str, value: Any, static: bool) -> None:
    """`obj.name = value` (`DELETED`: `del obj.name`) on a module already built,
    made visible: the module's own flat form is dropped, its static key follows a
    static field, and every flat form that rests on it is forgotten
    (`_flat_form.forget`), so the next call of a `filter_jit` function flattens
    the module afresh and sees the new value."""
    values = _flat_form.forget(obj)
    if value is DELETED:
        values.pop(name, None)
    else:
        values[name] = value
    if static:
        rekey(obj, values)
    _flat_form.written(obj)


def rekey(obj: Any, values: dict) -> None:
    """Keep the static key in `values` (`obj`'s instance dict) current."""
    if REBUILD_NAME in values:
        try:
            values[REBUILD_NAME] = _static_key.key(type(obj), values)
        except KeyError:  # a static field deleted: only the class is left to key
            values[REBUILD_NAME] = type(obj)._boxwood_rebuild


def set_fields(obj: Any, **values: Any) -> None:
    """Set fields of `obj`, a module just made by boxwood itself (nothing has seen
    it yet, so no cached flat form can rest on it), keeping its static key
    current."""
    own = instance_dict(obj)
    _flat_form.drop(own)
    own.update(values)
    rekey(obj, own)


def install_fields(cls: Any, fields: tuple) -> None:
    """Give each field of `cls` its `_Field`, unless something else stands in for
    it along the MRO (a property, a slot, a class attribute overriding it);
    `cls._boxwood_dict_fields` names the fields kept in the instance dict."""
    in_dict = []
    for f in fields:
        current = inspect.getattr_static(cls, f.name, dataclasses.MISSING)
        if (
            current is dataclasses.MISSING
            or current is f.default
            or isinstance(current, _Field)
        ):
            type.__setattr__(cls, f.name, _Field(f.name, f.default, is_static(f)))
            in_dict.append(f.name)
    cls._boxwood_dict_fields = frozenset(in_dict)
