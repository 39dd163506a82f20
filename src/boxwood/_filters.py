"""Leaf predicates and `filter` / `partition` / `combine`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)
_PY_SCALARS = (bool, int, float, complex)


def is_array(element: Any) -> bool:
    """`True` for JAX arrays and NumPy arrays/scalars; `False` otherwise."""
    return isinstance(element, _ARRAY_TYPES)


def is_array_like(element: Any) -> bool:
    """`True` for arrays, Python numbers (`bool`, `int`, `float`, `complex`) and
    objects with a `__jax_array__` method."""
    return isinstance(element, (*_ARRAY_TYPES, *_PY_SCALARS)) or callable(
        getattr(element, "__jax_array__", None)
    )


def _inexact_dtype(element: Any) -> bool:
    # jnp.issubdtype also understands extended dtypes such as typed PRNG keys
    return jnp.issubdtype(element.dtype, jnp.inexact)


def is_inexact_array(element: Any) -> bool:
    """`True` for floating-point or complex arrays (JAX or NumPy)."""
    return isinstance(element, _ARRAY_TYPES) and _inexact_dtype(element)


def is_inexact_array_like(element: Any) -> bool:
    """`True` for floating-point or complex arrays and Python `float`/`complex`."""
    if isinstance(element, _ARRAY_TYPES):  # jax 0.10 tracers: `__jax_array__ = None`
        return _inexact_dtype(element)
    to_array = getattr(element, "__jax_array__", None)
    if callable(to_array):
        element = to_array()
    if isinstance(element, _ARRAY_TYPES):
        return _inexact_dtype(element)
    return isinstance(element, (float, complex))


def _leaf_test(spec: Any) -> Callable[[Any], bool]:
    """The per-leaf question asked by one leaf of a filter spec."""
    if isinstance(spec, bool):
        return lambda _leaf: spec
    if callable(spec):
        return lambda leaf: bool(spec(leaf))
    raise ValueError(
        "`filter_spec` must be a pytree prefix of the input whose leaves are bools or "
        f"callables, got a leaf of type {type(spec).__name__}: {spec!r}."
    )


class _Sorted:
    """The leaves of a pytree, each marked selected or not by a filter spec.

    The spec is a prefix of the pytree: each of its leaves governs one subtree,
    whose own leaves (as `is_leaf` sees them) it marks. Both halves of a partition
    are rebuilt from this one pass."""

    __slots__ = ("_outer", "_groups")

    def __init__(self, pytree: Any, filter_spec: Any, is_leaf: Any) -> None:
        specs, self._outer = jax.tree_util.tree_flatten(filter_spec)
        try:
            subtrees = self._outer.flatten_up_to(pytree)
        except (ValueError, TypeError) as error:
            raise ValueError(
                "`filter_spec` must be a pytree prefix of the input (each of its "
                "leaves standing for a whole subtree), but its structure "
                f"{self._outer} does not fit the input: {error}"
            ) from None
        self._groups = []
        for spec, subtree in zip(specs, subtrees):
            test = _leaf_test(spec)
            leaves, inner = jax.tree_util.tree_flatten(subtree, is_leaf=is_leaf)
            marks = [test(leaf) for leaf in leaves]
            self._groups.append((inner, leaves, marks))

    def half(self, selected: bool, replace: Any) -> Any:
        """The pytree with `replace` wherever a leaf's mark is not `selected`."""
        rebuilt = [
            inner.unflatten(
                [x if mark is selected else replace for x, mark in zip(leaves, marks)]
            )
            for inner, leaves, marks in self._groups
        ]
        return self._outer.unflatten(rebuilt)


def filter(
    pytree: Any,
    filter_spec: Any,
    inverse: bool = False,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Keep the leaves selected by `filter_spec`; replace the others with `replace`.

    **Arguments:**

    - `pytree`: any pytree.
    - `filter_spec`: a pytree prefix of `pytree` whose leaves are bools or callables
      `leaf -> bool` (applied to every leaf of the matching subtree), e.g.
      `boxwood.is_array`.
    - `inverse`: keep the leaves that are *not* selected instead.
    - `replace`: what unselected leaves become.
    - `is_leaf`: as in `jax.tree_util`, for `pytree`.

    **Returns:** a pytree with the structure of `pytree`.

    >>> import boxwood, jax.numpy as jnp
    >>> boxwood.filter([jnp.ones(2), 3, "a"], boxwood.is_array)
    [Array([1., 1.], dtype=float32), None, None]
    """
    return _Sorted(pytree, filter_spec, is_leaf).half(not inverse, replace)


def partition(
    pytree: Any,
    filter_spec: Any,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[Any, Any]:
    """Split `pytree` into `(selected, rest)`; undo with [`boxwood.combine`][].

    Each output has the structure of `pytree`, with `replace` (default `None`) where
    the leaf went to the other half.

    >>> import boxwood, jax.numpy as jnp
    >>> arrays, static = boxwood.partition((jnp.zeros(1), "relu"), boxwood.is_array)
    >>> static
    (None, 'relu')
    """
    sorted_ = _Sorted(pytree, filter_spec, is_leaf)
    return sorted_.half(True, replace), sorted_.half(False, replace)


def combine(*pytrees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Merge pytrees of the same structure, taking the first non-`None` leaf at each
    position. The inverse of [`boxwood.partition`][].

    >>> import boxwood
    >>> boxwood.combine([1, None, None], [None, 2, None])
    [1, 2, None]
    """
    if not pytrees:
        raise TypeError("`combine` needs at least one pytree.")

    def stop(x: Any) -> bool:  # a `None` is a position to fill, not an empty node
        return x is None or (is_leaf is not None and bool(is_leaf(x)))

    first, *others = pytrees
    leaves, treedef = jax.tree_util.tree_flatten(first, is_leaf=stop)
    for position, other in enumerate(others, start=1):
        try:
            candidates = treedef.flatten_up_to(other)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"`combine`: its argument at position {position} does not have the "
                f"structure of the first ({treedef}, with `None` leaves): {error}"
            ) from None
        leaves = [c if x is None else x for x, c in zip(leaves, candidates)]
    return treedef.unflatten(leaves)
