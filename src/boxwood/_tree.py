"""Tree tools: `tree_at`, `tree_equal`, `apply_updates`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._filters import is_array

_MISSING = object()


class _Probe:
    """Stands in for one leaf while `where` is run, so leaves are found by identity
    even when the same object (an array, `None`, a small int) appears twice."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<leaf {self.index}>"


class _NoneProbe:
    """Stands in for one `None` while `where` is run: a pytree node with no
    children, as `None` is, so that `where` sees the same leaves (and the same leaf
    indices) as on the real pytree, yet the `None` can be selected by identity."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return "None"


jax.tree_util.register_pytree_node(
    _NoneProbe, lambda p: ((), p.index), lambda index, _: _NoneProbe(index)
)


def _probe(i: int, leaf: Any, none_is_leaf: bool) -> Any:
    return _NoneProbe(i) if leaf is None and not none_is_leaf else _Probe(i)


def _calls_none_a_leaf(is_leaf: Callable[[Any], bool]) -> bool:
    try:
        return bool(is_leaf(None))
    except Exception:  # an `is_leaf` that only expects nodes of its own kind
        return False


def _children(node: Any) -> tuple[list, Any] | None:
    """Immediate children of a pytree node, or `None` for a leaf."""
    children, treedef = jax.tree_util.tree_flatten(
        node, is_leaf=lambda c: c is not node
    )
    if jax.tree_util.treedef_is_leaf(treedef) and treedef.num_leaves == 1:
        return None
    return children, treedef


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any = _MISSING,
    # the sentinel `_MISSING` means "not given" (None is a valid replacement)
    replace_fn: Callable[[Any], Any] = _MISSING,  # pyright: ignore[reportArgumentType]
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Return a copy of `pytree` with the node(s) chosen by `where` replaced.

    **Arguments:**

    - `where`: `pytree -> node` or `pytree -> tuple of nodes`, e.g.
      `lambda m: m.layers[1].weight` or `lambda m: (m.weight, m.bias)`. A node may be
      a leaf, a whole subtree, or a `None`. `where` sees the pytree's structure
      as `jax.tree_util` does (a `None` is a node without leaves, unless `is_leaf`
      makes it a leaf), so `lambda t: jax.tree_util.tree_leaves(t)[i]` picks the
      same leaf as on `pytree` itself.
    - `pytree`: the pytree to copy (it is not modified).
    - `replace`: the new value (or a sequence of values, one per node).
    - `replace_fn`: alternatively, `old_node -> new_node`, applied to each node.
    - `is_leaf`: as in `jax.tree_util`.

    >>> import boxwood
    >>> boxwood.tree_at(lambda t: t[1], (1, 2, 3), replace=20)
    (1, 20, 3)
    """
    if (replace is _MISSING) == (replace_fn is _MISSING):
        raise ValueError("`tree_at` takes exactly one of `replace=` or `replace_fn=`.")

    def leaf_pred(x: Any) -> bool:
        return x is None or (is_leaf is not None and bool(is_leaf(x)))

    leaves, treedef = jax.tree_util.tree_flatten(pytree, is_leaf=leaf_pred)
    # `None` is a node without leaves, unless the caller's `is_leaf` makes it a leaf
    none_is_leaf = is_leaf is not None and _calls_none_a_leaf(is_leaf)
    probes = [_probe(i, x, none_is_leaf) for i, x in enumerate(leaves)]
    probe_tree = treedef.unflatten(probes)
    chosen = where(probe_tree)
    nodes, single = _as_nodes(chosen, probe_tree, leaf_pred)
    if replace is not _MISSING:
        if single:
            replace = (replace,)
        elif not isinstance(replace, Sequence) or len(replace) != len(nodes):
            raise ValueError(
                f"`where` selected {len(nodes)} nodes, so `replace` must be a sequence "
                f"of {len(nodes)} values; got {type(replace).__name__}."
            )
        new = {id(n): (lambda _old, v=v: v) for n, v in zip(nodes, replace)}
    else:
        new = {id(n): replace_fn for n in nodes}
    found: set[int] = set()

    def rebuild(original: Any, probe: Any) -> Any:
        fn = new.get(id(probe))
        if fn is not None:
            found.add(id(probe))
            return fn(original)
        if isinstance(probe, (_Probe, _NoneProbe)):
            return original
        parts = _children(original)
        if parts is None:
            return original
        children, node_def = parts
        probe_parts = _children(probe)
        assert probe_parts is not None  # the probe tree mirrors the original
        probe_children = probe_parts[0]
        return node_def.unflatten(
            [rebuild(o, p) for o, p in zip(children, probe_children)]
        )

    result = rebuild(pytree, probe_tree)
    if len(found) != len(new):
        raise ValueError(
            "`where` in `tree_at` returned something that is not a node of the pytree "
            "(or a node nested inside another selected node). `where` must return "
            "parts of its argument, such as `lambda m: m.linear.weight`; static fields "
            "are part of the structure, not nodes, so change them with "
            "`dataclasses.replace` or by building a new module."
        )
    return result


def _as_nodes(chosen: Any, probe_tree: Any, leaf_pred) -> tuple[list, bool]:
    node_ids = {id(probe_tree)}
    stack = [probe_tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (_Probe, _NoneProbe)):
            continue
        parts = _children(node)
        if parts is not None:
            for child in parts[0]:
                node_ids.add(id(child))
                stack.append(child)
    if id(chosen) in node_ids:
        return [chosen], True
    if isinstance(chosen, (tuple, list)):
        return list(chosen), False
    return [chosen], True


def _leaf_equal(a: Any, b: Any, rtol: float, atol: float) -> Any:
    if is_array(a) or is_array(b):
        if not (is_array(a) and is_array(b)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        traced = isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer)
        xp = (
            jnp
            if traced or isinstance(a, jax.Array) or isinstance(b, jax.Array)
            else np
        )
        if rtol == 0 and atol == 0:
            result = xp.all(xp.asarray(a) == xp.asarray(b))
        else:
            result = xp.allclose(xp.asarray(a), xp.asarray(b), rtol=rtol, atol=atol)
        return result if traced else bool(result)
    try:
        return bool(a == b)
    except Exception:  # e.g. objects whose `==` is elementwise
        return a is b


def tree_equal(
    *pytrees: Any, typematch: bool = False, rtol: float = 0.0, atol: float = 0.0
) -> Any:
    """`True` if all pytrees have the same structure and equal leaves.

    Arrays must match in shape, dtype and values (within `rtol`/`atol` if given).
    With `typematch=True` leaves must also have the same types. Under a JAX trace the
    result may be a traced boolean array.

    >>> import boxwood, jax.numpy as jnp
    >>> boxwood.tree_equal([jnp.ones(2), "a"], [jnp.ones(2), "a"])
    True
    """
    first, *rest = pytrees
    leaves0, treedef0 = jax.tree_util.tree_flatten(first)
    result: Any = True
    for other in rest:
        leaves, treedef = jax.tree_util.tree_flatten(other)
        if treedef != treedef0:
            return False
        for a, b in zip(leaves0, leaves):
            if typematch and type(a) is not type(b):
                return False
            same = _leaf_equal(a, b, rtol, atol)
            if same is False:
                return False
            if same is not True:
                result = same if result is True else result & same
    return result


def apply_updates(model: Any, updates: Any) -> Any:
    """Add `updates` (e.g. from an optax optimiser) to `model`, leaf by leaf.

    `None` updates leave the model's leaf unchanged, so updates computed with
    [`boxwood.filter_grad`][] (which gives `None` for non-differentiable leaves) apply
    directly.

    >>> import boxwood, jax.numpy as jnp
    >>> boxwood.apply_updates([jnp.ones(2), "relu"], [jnp.ones(2), None])
    [Array([2., 2.], dtype=float32), 'relu']
    """

    def add(update: Any, leaf: Any) -> Any:
        return leaf if update is None else leaf + update

    return jax.tree_util.tree_map(add, updates, model, is_leaf=lambda u: u is None)
