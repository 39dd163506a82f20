"""boxwood's optional C code and its loader: see README.md in this folder.

Two extensions, both optional:

- `_speedups` (`_speedups.c`): `FastCall` runs `filter_jit`'s warm calls,
  `Builder` rebuilds its outputs, and `install_call` rebuilds modules on JAX's
  unflatten path.
- `_fields` (`_fields.c`): `FieldBase`, the class attribute through which a
  module's fields are read.

Each name is `None` where its extension was not built (no C compiler at install
time) or when `BOXWOOD_PURE_PYTHON=1` is set. Every user of them has a Python twin
that does the same work with the same data (`_jit/_wrapper.py`, `_jit/_rebuild.py`,
`_module/_construct.py`, `_module/_instance.py`). `FastCall` and `Builder` are read
when a wrapper or builder is created, so tests can switch paths by setting them to
`None`; `_module._module.use_rebuild_slot` switches the rebuild slot.

This package imports nothing else of boxwood's but `_config`: it is a leaf that
`_module/` and `_jit/` both reach without a cycle.
"""

from __future__ import annotations

from typing import Any

from .._config import env_flag

FastCall: Any = None
Builder: Any = None
install_call: Any = None
FieldBase: Any = None

if not env_flag("BOXWOOD_PURE_PYTHON"):
    try:
        from ._speedups import Builder, FastCall, install_call  # noqa: F401
    except ImportError:  # not built: the Python paths serve
        pass
    try:
        from ._fields import FieldBase  # noqa: F401 (re-exported)
    except ImportError:  # not built: the Python twin serves
        pass


def active() -> bool:
    """Whether the compiled call paths are in use."""
    return None not in (FastCall, Builder, install_call)
