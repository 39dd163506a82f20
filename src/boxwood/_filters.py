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


def _expand_spec(spec: Any, subtree: Any, is_leaf) -> Any:
    """Turn one leaf of a filter spec into a tree of bools shaped like `subtree`."""
    if isinstance(spec, bool):
        return jax.tree_util.tree_map(lambda _: spec, subtree, is_leaf=is_leaf)
    if callable(spec):
        return jax.tree_util.tree_map(lambda x: bool(spec(x)), subtree, is_leaf=is_leaf)
    raise ValueError(
        "`filter_spec` must be a pytree prefix of the input whose leaves are bools or "
        f"callables, got a leaf of type {type(spec).__name__}: {spec!r}."
    )


def _mask(pytree: Any, filter_spec: Any, is_leaf) -> Any:
    return jax.tree_util.tree_map(
        lambda spec, sub: _expand_spec(spec, sub, is_leaf), filter_spec, pytree
    )


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
    mask = _mask(pytree, filter_spec, is_leaf)
    return jax.tree_util.tree_map(
        lambda keep, x: x if keep ^ inverse else replace, mask, pytree, is_leaf=is_leaf
    )


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
    mask = _mask(pytree, filter_spec, is_leaf)
    left = jax.tree_util.tree_map(
        lambda keep, x: x if keep else replace, mask, pytree, is_leaf=is_leaf
    )
    right = jax.tree_util.tree_map(
        lambda keep, x: replace if keep else x, mask, pytree, is_leaf=is_leaf
    )
    return left, right


def _is_none(x: Any) -> bool:
    return x is None


def _first_not_none(*xs: Any) -> Any:
    for x in xs:
        if x is not None:
            return x
    return None


def combine(*pytrees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Merge pytrees of the same structure, taking the first non-`None` leaf at each
    position. The inverse of [`boxwood.partition`][].

    >>> import boxwood
    >>> boxwood.combine([1, None, None], [None, 2, None])
    [1, 2, None]
    """
    if not pytrees:
        raise TypeError("`combine` needs at least one pytree.")
    if is_leaf is None:
        leaf = _is_none
    else:
        leaf = lambda x: x is None or is_leaf(x)  # noqa: E731
    return jax.tree_util.tree_map(_first_not_none, *pytrees, is_leaf=leaf)
