"""`filter_closure_convert`: make a function's closed-over arrays part of a pytree."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import jax.core

from .._filters import is_array
from .._module import Module, field
from .._tracebacks import hiding_own_frames
from ._eval_shape import filter_eval_shape
from ._split import OutBox, static_equal


def _is_struct(x: Any) -> bool:
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _without_weak_type(s: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(s.shape, s.dtype)


def _shapes(leaves: list) -> list:
    """Shapes and (canonical) dtypes of arrays, tracers or structs, weak types
    kept. Read from each leaf's abstract value: a loop converts its body and
    condition at every trace, and `jax.eval_shape` would trace a function per
    call."""
    structs = []
    for x in leaves:
        if isinstance(x, jax.ShapeDtypeStruct):
            structs.append(x)
        else:
            aval = jax.typeof(x)
            structs.append(
                jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
            )
    return structs


class _Layout:
    """The shape of a call's arguments (or of an output), as a static value: the
    treedef, and per leaf a `jax.ShapeDtypeStruct` for an array (weak types
    dropped: a function converted at a float32 array may be called with a Python
    float cast to float32) or the leaf itself for anything else."""

    __slots__ = ("treedef", "entries", "arrays")

    def __init__(self, tree: Any, is_dynamic: Callable[[Any], bool]) -> None:
        leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        self.arrays = tuple(bool(is_dynamic(x)) for x in leaves)
        shapes = iter(_shapes([x for x, dyn in zip(leaves, self.arrays) if dyn]))
        self.entries = tuple(
            _without_weak_type(next(shapes)) if dyn else x
            for x, dyn in zip(leaves, self.arrays)
        )

    def example(self) -> Any:
        return self.treedef.unflatten(self.entries)

    def _structs(self) -> tuple:
        return tuple(e for e, dyn in zip(self.entries, self.arrays) if dyn)

    def _statics(self) -> tuple:
        return tuple(e for e, dyn in zip(self.entries, self.arrays) if not dyn)

    def shown(self, arrays: bool) -> Any:
        """The example with only its arrays (or only its other leaves), for
        error messages."""
        return self.treedef.unflatten(
            [e if dyn == arrays else None for e, dyn in zip(self.entries, self.arrays)]
        )

    def same_arrays(self, other: _Layout) -> bool:
        return (
            self.treedef == other.treedef
            and self.arrays == other.arrays
            and self._structs() == other._structs()
        )

    def same_statics(self, other: _Layout) -> bool:
        mine, theirs = self._statics(), other._statics()
        return len(mine) == len(theirs) and all(map(static_equal, mine, theirs))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Layout)
            and self.same_arrays(other)
            and self.same_statics(other)
        )

    def __hash__(self) -> int:
        return hash((self.treedef, self.arrays))


def _arguments(
    layout: _Layout, args: tuple, kwargs: dict
) -> list:  # the arrays of a call, checked against `layout`
    call = _Layout((args, kwargs), is_array)
    if not layout.same_arrays(call):
        raise ValueError(
            "A function from `filter_closure_convert` was called with arrays of "
            f"other shapes or dtypes ({call.shown(True)}) than its example arguments "
            f"({layout.shown(True)}). Convert it again for the new arguments."
        )
    if not layout.same_statics(call):
        raise ValueError(
            "A function from `filter_closure_convert` was called with other "
            f"non-array arguments ({call.shown(False)}) than its example arguments "
            f"({layout.shown(False)}). Convert it again for the new arguments."
        )
    return [x for x in jax.tree_util.tree_leaves((args, kwargs)) if is_array(x)]


class _TrivialClosureConvert(Module):
    """A function that closes over nothing: kept as it is (no jaxpr traced)."""

    inputs: _Layout = field(static=True)
    fn: Callable = field(static=True)

    @property
    def in_struct(self) -> tuple[tuple, dict]:
        """`(args, kwargs)` of the example call, arrays as `ShapeDtypeStruct`s."""
        return self.inputs.example()

    @property
    def out_struct(self) -> Any:
        """The output's structure, arrays as `ShapeDtypeStruct`s."""
        args, kwargs = self.in_struct
        return filter_eval_shape(self.fn, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _arguments(self.inputs, args, kwargs)
        return self.fn(*args, **kwargs)


class _JaxprFunction(Module):
    """A function traced to a jaxpr whose closed-over arrays are `consts`."""

    inputs: _Layout = field(static=True)
    # A leaf, not static: two conversions of one function then share a structure,
    # and `combine` may pair one's arrays with the other's jaxpr.
    jaxpr: Any
    consts: list
    outputs: _Layout = field(static=True)

    @property
    def in_struct(self) -> tuple[tuple, dict]:
        """`(args, kwargs)` of the example call, arrays as `ShapeDtypeStruct`s."""
        return self.inputs.example()

    @property
    def out_struct(self) -> Any:
        """The output's structure, arrays as `ShapeDtypeStruct`s."""
        return self.outputs.example()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        results = iter(
            jax.core.eval_jaxpr(
                self.jaxpr, self.consts, *_arguments(self.inputs, args, kwargs)
            )
        )
        leaves = [
            next(results) if dyn else entry
            for entry, dyn in zip(self.outputs.entries, self.outputs.arrays)
        ]
        return self.outputs.treedef.unflatten(leaves)


@hiding_own_frames
def filter_closure_convert(fn: Callable, *args: Any, **kwargs: Any) -> Callable:
    """`jax.closure_convert` for functions of arbitrary pytrees: the arrays (and
    tracers) `fn` closes over become leaves of the returned function.

    Use it before handing a function across a boundary that must see every array it
    depends on, such as the rules of `jax.custom_vjp`.

    **Arguments:**

    - `fn`: the function, called as `fn(*args, **kwargs)`.
    - `*args`, `**kwargs`: example arguments. Only the shapes and dtypes of their
      arrays matter (`jax.ShapeDtypeStruct`s may stand in); their other leaves are
      fixed: the result must be called with equal ones.

    **Returns:**

    A module callable like `fn` on arguments of the same shapes; its `consts` field
    holds the closed-over arrays. As in Equinox, `in_struct` and `out_struct` give
    the example arguments `(args, kwargs)` and the output with
    `jax.ShapeDtypeStruct`s at their array leaves.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> def outer(z):
    ...     g = boxwood.filter_closure_convert(lambda a: z * a, jnp.ones(2))
    ...     return g.consts, g(jnp.array([1.0, 2.0]))
    >>> consts, out = boxwood.filter_jit(outer)(jnp.ones(2) * 3)
    >>> len(consts), out
    (1, Array([3., 6.], dtype=float32))
    """
    layout = _Layout((args, kwargs), _is_struct)
    if isinstance(fn, types.FunctionType) and fn.__closure__ is None:
        return _TrivialClosureConvert(layout, fn)
    # traced with the examples' weak types (a Python scalar stays weak, as in the
    # function's own trace); calls are checked without them (see `_Layout`)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    box = OutBox()

    def on_arrays(*arrays: Any) -> list:
        values = iter(arrays)
        filled = [next(values) if dyn else x for x, dyn in zip(leaves, layout.arrays)]
        a, kw = layout.treedef.unflatten(filled)
        out = fn(*a, **kw)
        box.put(_Layout(out, is_array))
        return [x for x in jax.tree_util.tree_leaves(out) if is_array(x)]

    traced_at = _shapes([x for x in leaves if _is_struct(x)])
    closed = jax.make_jaxpr(on_arrays)(*traced_at)
    return _JaxprFunction(layout, closed.jaxpr, list(closed.consts), box.get())
