"""`equinox` pointed at boxwood, as a pytest plugin: `pytest -p _compat_alias` (with
this folder on `PYTHONPATH`) installs the alias when pytest loads its plugins, before
any conftest or test module imports Equinox or a library built on it.

`equinox`, `equinox.nn`, `equinox.debug` and `equinox.internal` are boxwood's modules
of those names (`sys.modules`, as in the migration guide). Any other `equinox.NAME`
(a library reaching into Equinox's private modules, such as
`equinox._module._module`) is `boxwood.NAME` where boxwood has a module of that
name, and is missing otherwise (`ModuleNotFoundError`, which such libraries guard
against). Without this, Python would load a second copy of boxwood's module files
under the `equinox.` names, with classes distinct from boxwood's own.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

import boxwood
import boxwood.debug
import boxwood.internal
import boxwood.nn


def _boxwood_name(name: str) -> str:
    return "boxwood" + name[len("equinox") :]


class _EquinoxIsBoxwood(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `equinox.NAME` as the module `boxwood.NAME`, imported once."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "equinox" and not fullname.startswith("equinox."):
            return None
        if importlib.util.find_spec(_boxwood_name(fullname)) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(_boxwood_name(spec.name))
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import system sets `__spec__` to the alias's spec; boxwood's module
        # keeps its own (importlib.reload, pickle and find_spec read it).
        module.__spec__ = self._spec


def install() -> None:
    """Point `equinox` and its public submodules at boxwood, and every other
    `equinox.NAME` imported from now on at `boxwood.NAME`."""
    for name, module in (
        ("equinox", boxwood),
        ("equinox.nn", boxwood.nn),
        ("equinox.debug", boxwood.debug),
        ("equinox.internal", boxwood.internal),
    ):
        sys.modules[name] = module
    if not any(isinstance(f, _EquinoxIsBoxwood) for f in sys.meta_path):
        sys.meta_path.insert(0, _EquinoxIsBoxwood())


install()
