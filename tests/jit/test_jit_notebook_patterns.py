"""Notebook patterns: re-running a cell redefines a Module subclass (or a function)
under the same name. Calls of an existing `filter_jit` wrapper with instances of
the new class run the new class's code, on both call paths. Cells are simulated
by `exec` in one shared namespace, as a notebook kernel does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw

CLASS_CELL = """
class Scale(bw.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x * FACTOR
"""


def cell(namespace, source, **values):
    namespace.update(values)
    exec(compile(source, namespace["__file__"], "exec"), namespace)


@pytest.fixture
def kernel(request):
    # one "notebook" per test: its cells' file name, like a kernel's, is its own
    name = f"<notebook {request.node.name}>"
    return {
        "__name__": "__notebook__",
        "__file__": name,
        "bw": bw,
        "jax": jax,
        "jnp": jnp,
    }


def test_a_redefined_class_runs_its_new_code(kernel):
    apply = bw.filter_jit(lambda m, x: m(x))
    step = bw.filter_jit(lambda m: m)
    cell(kernel, CLASS_CELL, FACTOR=1)
    old = kernel["Scale"](jnp.ones(2))
    returned = step(step(old))  # carries its flat form (the fast path's key)
    for _ in range(3):
        np.testing.assert_array_equal(apply(old, 2.0), [2, 2])
        np.testing.assert_array_equal(apply(returned, 2.0), [2, 2])

    cell(kernel, CLASS_CELL, FACTOR=10)  # the cell, re-run with new code
    new = kernel["Scale"](jnp.ones(2))
    assert type(new).__qualname__ == type(old).__qualname__
    new_returned = step(step(new))
    for _ in range(3):
        np.testing.assert_array_equal(apply(new, 2.0), [20, 20])
        np.testing.assert_array_equal(apply(new_returned, 2.0), [20, 20])
        # instances of the old class keep the old class's code
        np.testing.assert_array_equal(apply(old, 2.0), [2, 2])
        np.testing.assert_array_equal(apply(returned, 2.0), [2, 2])
    assert apply.cache_info().traces == 2  # one per class


def test_rerunning_the_class_and_the_function_cells(kernel):
    fn_cell = """
@bw.filter_jit
def forward(model, x):
    return model(x)
"""
    results = []
    for factor in (1, 3, 5):
        cell(kernel, CLASS_CELL, FACTOR=factor)
        cell(kernel, fn_cell)
        model = kernel["Scale"](jnp.ones(2))
        results.append([float(kernel["forward"](model, 1.0)[0]) for _ in range(3)])
    assert results == [[1.0] * 3, [3.0] * 3, [5.0] * 3]


def test_a_redefined_function_in_a_static_field(kernel):
    cell(kernel, "def act(x):\n    return x + 1\n")
    cell(
        kernel,
        """
class Act(bw.Module):
    w: jax.Array
    fn: object = bw.field(static=True)

    def __call__(self, x):
        return self.fn(self.w * x)
""",
    )
    apply = bw.filter_jit(lambda m, x: m(x))
    first = kernel["Act"](jnp.ones(2), kernel["act"])
    np.testing.assert_array_equal(apply(first, 1.0), [2, 2])
    cell(kernel, "def act(x):\n    return x - 1\n")
    second = kernel["Act"](jnp.ones(2), kernel["act"])
    for _ in range(2):
        np.testing.assert_array_equal(apply(second, 1.0), [0, 0])
        np.testing.assert_array_equal(apply(first, 1.0), [2, 2])


def test_a_class_read_from_globals_is_traced_again_when_redefined(kernel):
    # A function that builds the module from a global name reads the class at
    # trace time; the class (by identity and code) is part of the cache key.
    cell(kernel, CLASS_CELL, FACTOR=1)
    cell(
        kernel,
        """
@bw.filter_jit
def build_and_apply(x):
    return Scale(jnp.ones(2))(x)
""",
    )
    fn = kernel["build_and_apply"]
    np.testing.assert_array_equal(fn(1.0), [1, 1])
    cell(kernel, CLASS_CELL, FACTOR=7)
    np.testing.assert_array_equal(fn(1.0), [7, 7])
    assert fn.cache_info().traces == 2
