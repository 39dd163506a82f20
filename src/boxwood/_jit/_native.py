"""The optional C extension (`_speedups.c`) and the switch to do without it.

`FastCall` runs `filter_jit`'s warm calls, `Builder` rebuilds its outputs and
`install_init` rebuilds modules on JAX's unflatten path. All are `None` where the
extension was not built (no C compiler at install time) or when
`BOXWOOD_PURE_PYTHON=1` is set. Every user of them has a Python path that does
the same work with the same data (`_filter_jit.py`, `_rebuild.py`,
`_module/_module.py`), and reads these names when it creates a wrapper, builder or
class, so tests can switch paths.
"""

from __future__ import annotations

from typing import Any

from .._config import _env_flag
from .._module._module import CLASS_HOOKS, MODULE_TYPES
from .._module._register import REBUILD_NAME
from .._module._static_key import StaticKey

FastCall: Any = None
Builder: Any = None
install_init: Any = None

if not _env_flag("BOXWOOD_PURE_PYTHON"):
    try:
        from ._speedups import Builder, FastCall, install_init
    except ImportError:  # not built: the Python paths serve
        pass


def active() -> bool:
    """Whether the compiled paths are in use."""
    return None not in (FastCall, Builder, install_init)


def _install_rebuild_init(cls: type) -> None:
    """Give a Module class the C rebuild slot (read at class creation)."""
    if install_init is not None:
        install_init(cls, REBUILD_NAME, StaticKey)


# classes created before this import (the Module core's own), then every new one
for _cls in list(MODULE_TYPES):
    if hasattr(_cls.__dict__.get("__init__"), "__boxwood_user_init__"):
        _install_rebuild_init(_cls)
CLASS_HOOKS.append(_install_rebuild_init)
