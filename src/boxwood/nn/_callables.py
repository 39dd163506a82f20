"""How layers hold the callables they are given (`MLP`'s activations, `Lambda`'s
function): a plain function as static structure, a callable with parameters as
ordinary (dynamic) pytree content.

Equinox stores such a callable as a plain field, so a plain function becomes a
non-array leaf: `eqx.filter_jit(model)` works but `jax.jit(model)` fails. boxwood
keeps a plain function out of the leaves by wrapping it in `StaticFunction` (a
module whose one field is static), so `jax.jit(model)` keeps working, while a
callable with arrays, such as `PReLU()` or `Partial(f, array)`, stays a pytree whose
arrays are trained, exactly as in Equinox.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._filters import is_array
from .._module import Module, field


class StaticFunction(Module):
    """A plain function held as static structure: `StaticFunction(f)(x) == f(x)`.

    Layers wrap the plain functions they are given in it (see
    [`boxwood.nn.Lambda`][]), so that a model holds only arrays and `jax.jit(model)`
    works. The function is at `.fn`.

    >>> import boxwood.nn, jax, jax.numpy as jnp
    >>> relu = boxwood.nn.Lambda(jax.nn.relu).fn
    >>> relu.fn is jax.nn.relu, jax.tree_util.tree_leaves(relu)
    (True, [])
    >>> relu(jnp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    """

    fn: Callable = field(static=True)

    # No row of its own in `boxwood.summary`: it is configuration, not a layer; and
    # every display (repr, the notebook tree, treescope) shows the function itself.
    __boxwood_summary_row__ = False
    __boxwood_shown_as__ = "fn"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """**Arguments:** anything `fn` takes.

        **Returns:** `fn(*args, **kwargs)`.
        """
        return self.fn(*args, **kwargs)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickled or deep-copied: a function that its module names is kept as that
        # name. `jax.nn.relu` (`MLP`'s default, a `custom_jvp`) and `jnp.tanh` (a
        # jitted function) do not pickle by themselves, and a deep copy of either
        # is a new object, so the copied model's static field, and the model,
        # would differ (pinned by tests/nn/test_nn_mlp.py,
        # test_default_activations_pickle_and_deep_copy_to_equal_models).
        name = importable_name(self.fn)
        if name is None:
            return super().__reduce_ex__(protocol)
        return (static_function_named, name)


def importable_name(fn: Any) -> tuple[str, str] | None:
    """`(module, qualified name)` under which `fn` is found by import, or `None`."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, qualname) if found is fn and found is not None else None


def static_function_named(module: str, qualname: str) -> StaticFunction:
    """The `StaticFunction` of the function `module.qualname` (what a pickled one
    holds; see `StaticFunction.__reduce_ex__`)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return StaticFunction(found)


def has_arrays(tree: Any) -> bool:
    """Whether `tree` has an array (JAX or NumPy) among its leaves."""
    return any(is_array(leaf) for leaf in jtu.tree_leaves(tree))


def store_callable(fn: Any, where: str) -> Any:
    """How a layer stores the callable `fn` it was given as argument `where`
    (e.g. `"MLP: `activation`"`).

    A pytree node (a Module, a `Partial`, ...) is kept as it is, so its arrays are
    leaves; a plain function (a pytree leaf) is wrapped in `StaticFunction`, which
    needs it to be hashable.
    """
    if not callable(fn):
        raise TypeError(f"{where} must be callable, got {type(fn).__name__}.")
    if not jtu.treedef_is_leaf(jtu.tree_structure(fn)):
        return fn
    if is_array(fn):
        raise TypeError(f"{where} must be a function, got an array.")
    try:
        hash(fn)
    except TypeError:
        raise TypeError(
            f"{where} is a plain callable of type {type(fn).__name__}, which is not "
            "hashable. boxwood stores plain functions as static structure (so that "
            "`jax.jit(model)` works), and static values must be hashable. Pass a "
            "hashable function, or make it a `boxwood.Module` (a pytree) whose "
            "arrays are then ordinary parameters."
        ) from None
    return StaticFunction(fn)


def copy_per_neuron(fn: Any, shape: tuple[int, ...]) -> Any:
    """`fn` with every array given leading axes `shape`: one copy per neuron.

    Equinox's `MLP` gives a learnt activation (e.g. `PReLU()`) separate parameters
    for every neuron of every layer; this builds the same arrays. A callable without
    arrays is returned unchanged.
    """
    if not has_arrays(fn):
        return fn

    def copy(leaf: Any) -> Any:
        if not is_array(leaf):
            return leaf
        leaf = jnp.asarray(leaf)
        return jnp.broadcast_to(leaf, shape + leaf.shape)

    return jtu.tree_map(copy, fn)


def call_per_neuron(fn: Any, x: Any, index: Any = None) -> Any:
    """Apply an activation made by `copy_per_neuron` to the vector `x`.

    With arrays, `fn`'s copies (first their entry `index`, if given) are applied
    one per entry of `x`; without, `fn(x)` is called once on the whole vector.
    """
    if not has_arrays(fn):
        return fn(x)
    if index is not None:
        fn = jtu.tree_map(lambda a: a[index] if is_array(a) else a, fn)
    leaves, treedef = jtu.tree_flatten(fn)
    mapped = [is_array(leaf) for leaf in leaves]
    arrays = [leaf for leaf, m in zip(leaves, mapped) if m]

    def one(arrays: list, xi: Any) -> Any:
        it = iter(arrays)
        full = [next(it) if m else leaf for leaf, m in zip(leaves, mapped)]
        return jtu.tree_unflatten(treedef, full)(xi)

    return jax.vmap(one)(arrays, x)
