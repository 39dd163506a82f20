"""`tree_check` and `tree_flatten_one_level`."""

from __future__ import annotations

from typing import Any

import jax


def tree_flatten_one_level(pytree: Any) -> tuple[list, Any]:
    """The immediate children of a pytree node (a leaf gives itself).

    **Arguments:**

    - `pytree`: the node.

    **Returns:**

    As `jax.tree_util.tree_flatten`: the list of children and a `PyTreeDef` whose
    leaves stand for them.

    >>> import boxwood
    >>> boxwood.tree_flatten_one_level({"a": 3, "b": (1, 2)})
    ([3, (1, 2)], PyTreeDef({'a': *, 'b': *}))
    >>> boxwood.tree_flatten_one_level(4)
    ([4], PyTreeDef(*))
    """
    parts = jax.tree_util.default_registry.flatten_one_level(pytree)
    if parts is None:  # a leaf
        return [pytree], jax.tree_util.tree_structure(pytree)
    children = list(parts[0])
    if any(child is pytree for child in children):
        raise ValueError(
            f"The pytree node of type `{type(pytree).__name__}` contains itself "
            "(it is self-referential); a pytree must be a tree."
        )
    return children, jax.tree_util.tree_structure(
        pytree, is_leaf=lambda node: node is not pytree
    )


def tree_check(pytree: Any) -> None:
    """Check that `pytree` is a tree: no node contains itself and no non-leaf node
    (a list, a module with leaves, ...) appears twice.

    JAX does not require this, but transformations copy pytrees without keeping
    identity, so a layer shared by two places before `jax.jit` is two independent
    layers after it. Leaves, empty containers and modules without leaves may repeat.

    **Arguments:**

    - `pytree`: the pytree to check.

    **Returns:**

    `None`. Raises a `ValueError` naming the path of the repeated node.

    >>> import boxwood
    >>> shared = [1.0]
    >>> boxwood.tree_check([shared, [1.0]])
    >>> boxwood.tree_check([shared, shared])
    Traceback (most recent call last):
    ...
    ValueError: The pytree node of type `list` at `[1]` also appears at `[0]`...
    """
    seen: dict[int, tuple[str, bool]] = {}  # id -> (path, still being visited)
    stack: list = [(pytree, (), False)]
    while stack:
        node, path, leaving = stack.pop()
        if leaving:
            seen[id(node)] = (seen[id(node)][0], False)
            continue
        children, treedef = tree_flatten_one_level(node)
        if treedef.num_nodes == 1 or treedef.num_leaves == 0:
            continue  # a leaf, or an empty container: repeats are harmless
        where = jax.tree_util.keystr(path) or "the root"
        if id(node) in seen:
            first, active = seen[id(node)]
            kind = type(node).__name__
            if active:
                raise ValueError(
                    f"The pytree node of type `{kind}` at `{first}` contains itself (at "
                    f"`{where}`); a pytree must be a tree."
                )
            raise ValueError(
                f"The pytree node of type `{kind}` at `{where}` also appears at "
                f"`{first}`. After a JAX transformation the two places hold separate "
                "copies, so updates to one will not reach the other. Use two distinct "
                "objects, or store it once and refer to it by position."
            )
        seen[id(node)] = (where, True)
        stack.append((node, path, True))
        keyed = jax.tree_util.tree_flatten_with_path(
            node, is_leaf=lambda x, node=node: x is not node
        )[0]
        for key, child in reversed(keyed):
            stack.append((child, path + key, False))
