"""Tree tools: `tree_at`, `tree_equal`, `apply_updates`."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._filters import is_array

_MISSING = object()


class TreeAtReplaceError(ValueError, TypeError):
    """`replace` is not a sequence although `where` selected several nodes: a
    `TypeError` as in Equinox, and a `ValueError` as boxwood first raised it."""


class LeafProbe:
    """Stands in for one leaf while `where` is run, so leaves are found by identity
    even when the same object (an array, `None`, a small int) appears twice."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<leaf {self.index}>"


class _NoneProbe:
    """Stands in for one `None` or `()` while `where` is run: a pytree node with no
    children, as they are, so that `where` sees the same leaves (and the same leaf
    indices) as on the real pytree, yet that node can be selected by identity
    (`None` and `()` are singletons: the same object at every place)."""

    __slots__ = ("index", "text")

    def __init__(self, index: int, text: str = "None"):
        self.index = index
        self.text = text

    def __repr__(self) -> str:
        return self.text


jax.tree_util.register_pytree_node(
    _NoneProbe,
    lambda p: ((), (p.index, p.text)),
    lambda aux, _: _NoneProbe(*aux),
)


def _is_empty_tuple(x: Any) -> bool:
    return type(x) is tuple and not x


def _probe(i: int, leaf: Any, none_is_leaf: bool, user_leaf) -> Any:
    if leaf is None and not none_is_leaf:
        return _NoneProbe(i)
    if _is_empty_tuple(leaf) and not (user_leaf is not None and user_leaf(leaf)):
        return _NoneProbe(i, "()")
    return LeafProbe(i)


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
        return (
            x is None
            or _is_empty_tuple(x)
            or (is_leaf is not None and bool(is_leaf(x)))
        )

    leaves, treedef = jax.tree_util.tree_flatten(pytree, is_leaf=leaf_pred)
    probe_tree, nodes, single = _select(where, leaves, treedef, is_leaf, leaf_pred)
    new = _replacements(nodes, single, replace, replace_fn)
    found: set[int] = set()
    result = _rebuild(pytree, probe_tree, new, found)
    if len(found) != len(new):
        raise ValueError(
            "`where` in `tree_at` returned something that is not a node of the pytree "
            "(or a node nested inside another selected node). `where` must return "
            "parts of its argument, such as `lambda m: m.linear.weight`; static fields "
            "are part of the structure, not nodes, so change them with "
            "`dataclasses.replace` or by building a new module."
        )
    return result


def _select(
    where: Callable, leaves: list, treedef: Any, is_leaf: Callable | None, leaf_pred
) -> tuple[Any, list, bool]:
    """`(probe_tree, nodes, single)`: the stand-in tree `where` was run on, the
    nodes of it that `where` chose, and whether it chose one node (not a
    sequence)."""
    # `None` is a node without leaves, unless the caller's `is_leaf` makes it a leaf
    none_is_leaf = is_leaf is not None and _calls_none_a_leaf(is_leaf)
    probes = [_probe(i, x, none_is_leaf, is_leaf) for i, x in enumerate(leaves)]
    probe_tree, nodes, single = None, [None], True
    if not none_is_leaf and any(x is None for x in leaves):
        # First as Equinox does, with the `None`s themselves in place: a `where`
        # may test them (diffrax: `[x for x in ts if x is not None]`). Stand-ins for
        # them only when `where` picks a `None`.
        plain = [None if x is None else p for x, p in zip(leaves, probes)]
        probe_tree = treedef.unflatten(plain)
        nodes, single = _as_nodes(where(probe_tree), probe_tree, leaf_pred)
    if any(n is None for n in nodes):
        probe_tree = treedef.unflatten(probes)
        nodes, single = _as_nodes(where(probe_tree), probe_tree, leaf_pred)
    return probe_tree, nodes, single


def _replacements(nodes: list, single: bool, replace: Any, replace_fn: Any) -> dict:
    """`id(node) -> old -> new` for each chosen node, from `replace` (checked
    against the nodes) or `replace_fn`."""
    if replace is _MISSING:
        return {id(n): replace_fn for n in nodes}
    if single:
        replace = (replace,)
    elif not isinstance(replace, Sequence):
        raise TreeAtReplaceError(
            f"`where` selected {len(nodes)} nodes, so `replace` must be a sequence "
            f"of {len(nodes)} values; got {type(replace).__name__}."
        )
    elif len(replace) != len(nodes):
        raise ValueError(
            f"`where` selected {len(nodes)} nodes, so `replace` must be a sequence "
            f"of {len(nodes)} values; got {type(replace).__name__}."
        )
    return {id(n): (lambda _old, v=v: v) for n, v in zip(nodes, replace)}


def _rebuild(original: Any, probe: Any, new: dict, found: set[int]) -> Any:
    """`original` with each node whose stand-in (in `probe`, its mirror in the probe
    tree) is a key of `new` replaced; the ids of those stand-ins go into `found`."""
    fn = new.get(id(probe))
    if fn is not None:
        found.add(id(probe))
        return fn(original)
    if isinstance(probe, (LeafProbe, _NoneProbe)):
        return original
    parts = _children(original)
    if parts is None:
        return original
    children, node_def = parts
    probe_parts = _children(probe)
    assert probe_parts is not None  # the probe tree mirrors the original
    probe_children = probe_parts[0]
    return node_def.unflatten(
        [_rebuild(o, p, new, found) for o, p in zip(children, probe_children)]
    )


def _as_nodes(chosen: Any, probe_tree: Any, leaf_pred) -> tuple[list, bool]:
    node_ids = {id(probe_tree)}
    stack = [probe_tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (LeafProbe, _NoneProbe)):
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


_NUMPY = (np.ndarray, np.generic)


def _values_equal(xp: Any, a: Any, b: Any, rtol: float, atol: float) -> Any:
    exact = (rtol == 0 and atol == 0) or not xp.issubdtype(a.dtype, xp.inexact)
    if exact:
        return xp.all(xp.asarray(a) == xp.asarray(b))
    return xp.allclose(xp.asarray(a), xp.asarray(b), rtol=rtol, atol=atol)


def _leaf_equal(a: Any, b: Any, rtol: float, atol: float) -> Any:
    """`False`, `True`, or a JAX boolean (where a JAX array is compared)."""
    if is_array(a) or is_array(b):
        if not (is_array(a) and is_array(b)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if isinstance(a, _NUMPY) and isinstance(b, _NUMPY):
            return bool(_values_equal(np, a, b, rtol, atol))
        return _values_equal(jnp, a, b, rtol, atol)
    try:
        return bool(a == b)
    except Exception:  # e.g. objects whose `==` is elementwise
        return a is b


def tree_equal(
    *pytrees: Any, typematch: bool = False, rtol: float = 0.0, atol: float = 0.0
) -> Any:
    """`True` if all pytrees have the same structure and equal leaves.

    Arrays must match in shape, dtype and values (within `rtol`/`atol` if given, for
    floating-point arrays). With `typematch=True` leaves must also have the same
    types (so a NumPy array never equals a JAX array). As in Equinox, the result is
    a Python `bool` when it does not depend on the values of JAX arrays (different
    structures, shapes, dtypes or non-array leaves, or NumPy arrays only), and
    otherwise a JAX boolean scalar (a tracer under `jax.jit`). So
    `tree_equal(...) is True` holds only when equality is known without reading any
    JAX array's values; outside a trace, `bool(tree_equal(...))` gives the answer.

    >>> import boxwood, jax.numpy as jnp
    >>> boxwood.tree_equal([jnp.ones(2), "a"], [jnp.ones(2), "a"])
    Array(True, dtype=bool)
    >>> boxwood.tree_equal([1, "a"], [1, "b"])
    False
    """
    if not pytrees:
        raise ValueError("`tree_equal` needs at least one pytree to compare.")
    flat = [jax.tree_util.tree_flatten(tree) for tree in pytrees]
    if any(treedef != flat[0][1] for _, treedef in flat[1:]):
        return False
    pending = []  # JAX booleans: equality that depends on array values
    for column in zip(*(leaves for leaves, _ in flat)):
        verdict = _column_equal(column, typematch, rtol, atol)
        if verdict is False:
            return False
        if verdict is not True:
            pending.append(verdict)
    return functools.reduce(operator.and_, pending) if pending else True


def _column_equal(column: tuple, typematch: bool, rtol: float, atol: float) -> Any:
    """Whether the leaves at one position of every tree equal the first tree's:
    `True`, `False`, or a JAX boolean."""
    reference, *others = column
    pending = []
    for other in others:
        if typematch and type(other) is not type(reference):
            return False
        verdict = _leaf_equal(reference, other, rtol, atol)
        if verdict is False:
            return False
        if verdict is not True:
            pending.append(verdict)
    return functools.reduce(operator.and_, pending) if pending else True


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
