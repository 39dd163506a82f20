"""The instance dict of modules, read and replaced through its slot.

`Instance` is the base that gives modules their instance dict. Its `__dict__` slot
is read and set directly (`instance_dict`, `set_dict`), bypassing
`Module.__setattr__` and `Module.__dict__` (the property users see, which fills in
and hands out the fields: `_module._user_dict`).
"""

from __future__ import annotations


class Instance:
    """The base that gives modules their instance dict."""

    __slots__ = ("__dict__", "__weakref__")


# `instance_dict(obj)`: the instance dict as it is; `set_dict(obj, d)`: make `d` the
# instance dict in one step (the cheapest rebuild measured).
instance_dict = Instance.__dict__["__dict__"].__get__
set_dict = Instance.__dict__["__dict__"].__set__
