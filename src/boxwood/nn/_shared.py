"""`Shared`: tie nodes of a pytree together (e.g. input and output embeddings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._filters import combine, is_array, partition
from .._module import Module, field
from .._pretty import tree_pformat
from .._tree import tree_at, tree_equal


class SharedNode(Module):
    """Placeholder left by [`boxwood.nn.Shared`][] where a tied node was removed.

    It is a pytree node with no leaves, so it carries no parameters, gradients or
    optimiser state.
    """

    def __repr__(self) -> str:
        return "SharedNode()"


def _structure(fn: Callable[[Any], Any], pytree: Any) -> Any:
    """`fn(pytree)` with arrays replaced by their shape and dtype, computed without
    doing any array work."""
    arrays, rest = partition(pytree, is_array)
    static_out = []

    def run(arrays: Any) -> Any:
        out_arrays, out_rest = partition(fn(combine(arrays, rest)), is_array)
        static_out.append(out_rest)
        return out_arrays

    shapes = jax.eval_shape(run, arrays)
    return combine(shapes, static_out[0])


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
        source, dest = _structure(get, pytree), _structure(where, pytree)
        if tree_equal(source, dest) is not True:
            raise ValueError(
                "Every node being shared together (`Shared`) must have the same pytree "
                f"structure, shapes and dtypes. `get` gives {tree_pformat(source)}, but `where` "
                f"selects {tree_pformat(dest)}."
            )
        self.pytree = tree_at(where, pytree, replace_fn=lambda _: SharedNode())
        self.where = where
        self.get = get

    def __call__(self) -> Any:
        """**Returns:** the pytree, with `get(pytree)` in place of the nodes chosen by
        `where`."""
        return tree_at(self.where, self.pytree, self.get(self.pytree))
