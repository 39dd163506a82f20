"""tests/conftest.py empties JAX's caches between two test files once a worker has
compiled `COMPILES_BEFORE_CLEARING` programs, and only then."""

import pathlib
from types import SimpleNamespace

import jax
import pytest

CONFTEST = pathlib.Path(__file__).parents[1] / "conftest.py"


@pytest.fixture
def harness(request, monkeypatch):
    """tests/conftest.py as pytest loaded it (notebooks/conftest.py is a
    `conftest` module too), with its count saved and restored."""
    module = next(
        plugin
        for plugin in request.config.pluginmanager.get_plugins()
        if getattr(plugin, "__file__", None) == str(CONFTEST)
    )
    monkeypatch.setattr(module, "_compiles_since_clearing", [0])
    return module


def _item(name):
    return SimpleNamespace(path=pathlib.Path(name))


def test_caches_are_emptied_between_files_once_enough_is_compiled(
    harness, count_compiles
):
    f = jax.jit(lambda x: x * 3 + 1)
    f(1.0)
    assert harness._compiles_since_clearing[0] >= 1  # the listener counts
    harness._compiles_since_clearing[0] = harness.COMPILES_BEFORE_CLEARING
    harness.pytest_runtest_teardown(_item("a.py"), _item("a.py"))  # same file
    with count_compiles() as events:
        f(2.0)
    assert events == []
    harness.pytest_runtest_teardown(_item("a.py"), _item("b.py"))  # next file
    assert harness._compiles_since_clearing[0] == 0
    with count_compiles() as events:
        f(3.0)
    assert len(events) == 1  # compiled again: the caches were emptied


def test_below_the_count_the_caches_are_kept(harness, count_compiles):
    f = jax.jit(lambda x: x * 5 - 2)
    f(1.0)
    harness._compiles_since_clearing[0] = harness.COMPILES_BEFORE_CLEARING - 1
    harness.pytest_runtest_teardown(_item("a.py"), None)  # the worker's last item
    harness.pytest_runtest_teardown(_item("a.py"), _item("b.py"))
    with count_compiles() as events:
        f(2.0)
    assert events == []
