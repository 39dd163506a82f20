"""`filter_closure_convert`: make a function's closed-over arrays part of a pytree."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import jax.core

from ._eval_shape import filter_eval_shape
from ._filters import combine, is_array, partition
from ._module import Module, field
from ._partition import OutBox, static_equal


def _is_struct(x: Any) -> bool:
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _structs(tree: Any) -> Any:
    # Weak types are dropped: a function converted at a float32 array may be called
    # with a Python float cast to float32 (as Equinox's does).
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree
    )


def _flat(tree: Any) -> tuple:
    """`tree` as a hashable `(leaves, treedef)` pair, for a static field."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return tuple(leaves), treedef


def _flat_equal(a: Any, flat_b: tuple) -> bool:
    la, da = jax.tree_util.tree_flatten(a)
    lb, db = flat_b
    return da == db and all(static_equal(x, y) for x, y in zip(la, lb))


def _unflat(flat: tuple) -> Any:
    return jax.tree_util.tree_unflatten(flat[1], flat[0])


class _ClosureConvertBase(Module):
    """What the two kinds of converted function share: the example arguments'
    structure, the argument check, and the attributes libraries built on Equinox
    read (`in_struct`, `out_struct`: pytrees with `jax.ShapeDtypeStruct`s at the
    array leaves)."""

    in_dynamic_struct: Any = field(static=True)  # `(leaves, treedef)`
    in_static: Any = field(static=True)

    @property
    def in_struct(self) -> tuple[tuple, dict]:
        """`(args, kwargs)` of the example call, arrays as `ShapeDtypeStruct`s."""
        return combine(_unflat(self.in_dynamic_struct), _unflat(self.in_static))

    def _dynamic_inputs(self, args: tuple, kwargs: dict) -> list:
        dynamic, static = partition((args, kwargs), is_array)
        got = _structs(jax.eval_shape(lambda: dynamic))
        if not _flat_equal(got, self.in_dynamic_struct):
            raise ValueError(
                "A function from `filter_closure_convert` was called with arrays of "
                f"other shapes or dtypes ({got}) than its example arguments "
                f"({_unflat(self.in_dynamic_struct)}). Convert it again for the new "
                "arguments."
            )
        if not _flat_equal(static, self.in_static):
            raise ValueError(
                "A function from `filter_closure_convert` was called with other "
                f"non-array arguments ({static}) than its example arguments "
                f"({_unflat(self.in_static)}). Convert it again for the new arguments."
            )
        return jax.tree_util.tree_leaves(dynamic)


class _TrivialClosureConvert(_ClosureConvertBase):
    """A function that closes over nothing: kept as it is (no jaxpr traced)."""

    fn: Callable = field(static=True)

    @property
    def out_struct(self) -> Any:
        """The output's structure, arrays as `ShapeDtypeStruct`s."""
        args, kwargs = self.in_struct
        return filter_eval_shape(self.fn, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._dynamic_inputs(args, kwargs)
        return self.fn(*args, **kwargs)


class _ClosureConvert(_ClosureConvertBase):
    """A function traced to a jaxpr whose closed-over arrays are `consts`."""

    # A leaf, not static (as in Equinox): two conversions of one function then
    # share a structure, and `combine` may pair one's arrays with the other's jaxpr.
    jaxpr: Any
    consts: list
    out_dynamic_struct: Any = field(static=True)  # `(leaves, treedef)`
    out_static: Any = field(static=True)

    @property
    def out_struct(self) -> Any:
        """The output's structure, arrays as `ShapeDtypeStruct`s."""
        return combine(_unflat(self.out_dynamic_struct), _unflat(self.out_static))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = self._dynamic_inputs(args, kwargs)
        out = jax.core.eval_jaxpr(self.jaxpr, self.consts, *leaves)
        out = jax.tree_util.tree_unflatten(self.out_dynamic_struct[1], out)
        return combine(out, _unflat(self.out_static))


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
    in_dynamic, in_static = partition((args, kwargs), _is_struct)
    # traced with the examples' weak types (a Python scalar stays weak, as in the
    # function's own trace), checked at calls without them (see `_structs`)
    shaped = jax.eval_shape(lambda: in_dynamic)
    in_structs = _structs(shaped)
    if isinstance(fn, types.FunctionType) and fn.__closure__ is None:
        return _TrivialClosureConvert(_flat(in_structs), _flat(in_static), fn)
    in_treedef = jax.tree_util.tree_structure(in_structs)
    box = OutBox()

    def flat_fn(*leaves: Any) -> list:
        a, kw = combine(jax.tree_util.tree_unflatten(in_treedef, leaves), in_static)
        dynamic, static = partition(fn(*a, **kw), is_array)
        out, treedef = jax.tree_util.tree_flatten(dynamic)
        box.put((static, treedef))
        return out

    closed = jax.make_jaxpr(flat_fn)(*jax.tree_util.tree_leaves(shaped))
    out_static, out_treedef = box.get()
    out_leaves = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.out_avals]
    return _ClosureConvert(
        _flat(in_structs), _flat(in_static), closed.jaxpr, list(closed.consts),
        (tuple(out_leaves), out_treedef), _flat(out_static),
    )  # fmt: skip
