"""`Shared`: tie nodes of a pytree together (e.g. input and output embeddings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._filters import combine, is_array, partition
from .._module import Module, field
from .._pretty import tree_pformat
from .._tree import tree_at


class SharedNode(Module):
    """Placeholder left by [`boxwood.nn.Shared`][] where a tied node was removed.

    It is a pytree node with no leaves, so it carries no parameters, gradients or
    optimiser state.
    """

    def __repr__(self) -> str:
        return "SharedNode()"


def _abstract_targets(pytree: Any, where: Callable, get: Callable) -> tuple[Any, Any]:
    """`(where(pytree), get(pytree))` with every array as a `jax.ShapeDtypeStruct`:
    both traced together once, abstractly (no array work, e.g. no transpose)."""
    arrays, others = partition(pytree, is_array)
    non_arrays: list[Any] = []

    def both(arrays: Any) -> Any:
        full = combine(arrays, others)
        out_arrays, out_others = partition((where(full), get(full)), is_array)
        non_arrays.append(out_others)
        return out_arrays

    return combine(jax.eval_shape(both, arrays), non_arrays[0])


def _same_leaf(target: Any, value: Any) -> bool:
    """Arrays (abstract here) by shape and dtype, anything else by type and value."""
    abstract = jax.ShapeDtypeStruct
    if isinstance(target, abstract) or isinstance(value, abstract):
        return (
            isinstance(target, abstract)
            and isinstance(value, abstract)
            and (target.shape, target.dtype) == (value.shape, value.dtype)
        )
    try:
        return type(target) is type(value) and bool(target is value or target == value)
    except Exception:  # a value whose `==` is not a plain truth value
        return False


def _first_difference(targets: Any, values: Any) -> str | None:
    """What differs between the nodes `where` selects and those `get` gives, or
    None when they agree in structure, shapes, dtypes and non-array leaves."""
    target_leaves, target_def = jax.tree_util.tree_flatten(targets)
    value_leaves, value_def = jax.tree_util.tree_flatten(values)
    if target_def != value_def:
        return f"structures {target_def} and {value_def}"
    for n, (t, v) in enumerate(zip(target_leaves, value_leaves)):
        if not _same_leaf(t, v):
            return f"leaf {n}: {tree_pformat(t)} and {tree_pformat(v)}"
    return None


def _placeholder(_: Any) -> SharedNode:
    return SharedNode()


class Shared(Module):
    """Ties together nodes of a pytree, so that they are one parameter.

    A module appearing twice in a pytree is two copies that train independently.
    `Shared(pytree, where, get)` instead stores `pytree` with the nodes chosen by
    `where` replaced by a `SharedNode` placeholder (no leaves), and
    `shared()` rebuilds the full pytree with `get(pytree)` in their place. The tied
    value therefore exists once, and its gradient is the sum of the gradients of
    all its uses.

    ```python
    embedding = boxwood.nn.Embedding(vocab, dim, key=k1)
    linear = boxwood.nn.Linear(dim, vocab, key=k2)
    shared = boxwood.nn.Shared(
        (embedding, linear),
        where=lambda pair: pair[1].weight,
        get=lambda pair: pair[0].weight,
    )
    embedding, linear = shared()  # linear.weight is embedding.weight
    ```

    `get` may transform the value (e.g. `lambda p: p[0].weight.T`). `where` and
    `get` are static fields: use named functions or lambdas that are created once.
    """

    pytree: Any
    where: Callable[[Any], Any] = field(static=True)
    get: Callable[[Any], Any] = field(static=True)

    def __init__(
        self, pytree: Any, where: Callable[[Any], Any], get: Callable[[Any], Any]
    ):
        """**Arguments:**

        - `pytree`: the pytree containing the nodes to tie.
        - `where`: selects the node(s) to replace, as in [`boxwood.tree_at`][]: one
          node, or a tuple of nodes.
        - `get`: returns the value(s) to put there: one value, or a sequence of the
          same length as `where`'s. Each must have the same structure, shapes and
          dtypes as the node it replaces.
        """
        targets, values = _abstract_targets(pytree, where, get)
        difference = _first_difference(targets, values)
        if difference is not None:
            raise ValueError(
                "Every node being shared together (`Shared`) must have the same pytree "
                f"structure, shapes and dtypes: `where` selects {tree_pformat(targets)}, "
                f"but `get` gives {tree_pformat(values)} (they differ in {difference})."
            )
        self.pytree = tree_at(where, pytree, replace_fn=_placeholder)
        self.where = where
        self.get = get

    def __call__(self) -> Any:
        """**Returns:** the pytree, with `get(pytree)` in place of the nodes chosen by
        `where`."""
        return tree_at(self.where, self.pytree, self.get(self.pytree))
