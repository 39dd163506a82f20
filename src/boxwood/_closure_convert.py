"""`filter_closure_convert`: make a function's closed-over arrays part of a pytree."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import jax.core

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


class _Converted(Module):
    jaxpr: Any = field(static=True)  # `None` for a function with no closure
    fn: Callable | None = field(static=True)
    consts: list
    in_structs: Any = field(static=True)
    in_static: Any = field(static=True)
    out_static: Any = field(static=True)
    out_treedef: Any = field(static=True)

    def _dynamic_inputs(self, args: tuple, kwargs: dict) -> list:
        dynamic, static = partition((args, kwargs), is_array)
        got = _structs(jax.eval_shape(lambda: dynamic))
        if not _flat_equal(got, self.in_structs):
            raise ValueError(
                "A function from `filter_closure_convert` was called with arrays of "
                f"other shapes or dtypes ({got}) than its example arguments "
                f"({_unflat(self.in_structs)}). Convert it again for the new arguments."
            )
        if not _flat_equal(static, self.in_static):
            raise ValueError(
                "A function from `filter_closure_convert` was called with other "
                f"non-array arguments ({static}) than its example arguments "
                f"({_unflat(self.in_static)}). Convert it again for the new arguments."
            )
        return jax.tree_util.tree_leaves(dynamic)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = self._dynamic_inputs(args, kwargs)
        if self.jaxpr is None:
            assert self.fn is not None  # kept when there is no jaxpr
            return self.fn(*args, **kwargs)
        out = jax.core.eval_jaxpr(self.jaxpr, self.consts, *leaves)
        out = jax.tree_util.tree_unflatten(self.out_treedef, out)
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
    holds the closed-over arrays.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> def outer(z):
    ...     g = boxwood.filter_closure_convert(lambda a: z * a, jnp.ones(2))
    ...     return g.consts, g(jnp.array([1.0, 2.0]))
    >>> consts, out = boxwood.filter_jit(outer)(jnp.ones(2) * 3)
    >>> len(consts), out
    (1, Array([3., 6.], dtype=float32))
    """
    in_dynamic, in_static = partition((args, kwargs), _is_struct)
    in_structs = _structs(jax.eval_shape(lambda: in_dynamic))
    if isinstance(fn, types.FunctionType) and fn.__closure__ is None:
        return _Converted(None, fn, [], _flat(in_structs), _flat(in_static), None, None)
    in_treedef = jax.tree_util.tree_structure(in_structs)
    box = OutBox()

    def flat_fn(*leaves: Any) -> list:
        a, kw = combine(jax.tree_util.tree_unflatten(in_treedef, leaves), in_static)
        dynamic, static = partition(fn(*a, **kw), is_array)
        out, treedef = jax.tree_util.tree_flatten(dynamic)
        box.put((static, treedef))
        return out

    closed = jax.make_jaxpr(flat_fn)(*jax.tree_util.tree_leaves(in_structs))
    out_static, out_treedef = box.get()
    return _Converted(
        closed.jaxpr, None, list(closed.consts), _flat(in_structs), _flat(in_static),
        _flat(out_static), out_treedef,
    )  # fmt: skip
