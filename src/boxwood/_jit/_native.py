"""The optional C extension (`_speedups.c`) and the switch to do without it.

`FastCall` runs `filter_jit`'s warm calls, `Builder` rebuilds its outputs and
`install_call` rebuilds modules on JAX's unflatten path. All are `None` where the
extension was not built (no C compiler at install time) or when
`BOXWOOD_PURE_PYTHON=1` is set. Every user of them has a Python path that does
the same work with the same data (`_wrapper.py`, `_rebuild.py`,
`_module/_construct.py`); `FastCall` and `Builder` are read when a wrapper or
builder is created, and `use_rebuild_slot` switches the rebuild, so tests can
switch paths.
"""

from __future__ import annotations

from typing import Any

from .._config import env_flag
from .._module._module import SLOTTED, Module
from .._module._register import REBUILD_NAME
from .._module._static_key import StaticKey

FastCall: Any = None
Builder: Any = None
install_call: Any = None

if not env_flag("BOXWOOD_PURE_PYTHON"):
    try:
        from ._speedups import Builder, FastCall, install_call
    except ImportError:  # not built: the Python paths serve
        pass


def active() -> bool:
    """Whether the compiled paths are in use."""
    return None not in (FastCall, Builder, install_call)


def use_rebuild_slot(on: bool) -> bool:
    """Rebuild modules on JAX's unflatten path in C (`on`) or through the
    metaclass's Python `__call__`. **Returns** whether the C slot is in use."""
    if install_call is None:
        return False
    if on:
        install_call(type(Module), REBUILD_NAME, StaticKey, SLOTTED)
    else:
        install_call(type(Module), None, None, None)
    return on


use_rebuild_slot(True)
