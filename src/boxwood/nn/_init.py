"""`nn.init`: re-initialise the arrays of a model that a `where` or a filter selects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._init import (
    Initializer,
    drawn_shape,
    fast_call,
    layout_at,
    split_keys,
    to_stored,
)
from .._paths import dotted_path
from .._tree import LeafProbe

_MSG_SELECT = (
    "nn.init: pass exactly one of `where` (`model -> node(s)`, as in `tree_at`: "
    "`nn.init(model, lambda m: [l.weight for l in m.layers], init, key=key)`) or "
    "`filter=` (`leaf -> bool`: `nn.init(model, init=init, filter=lambda x: x.ndim "
    "== 2, key=key)`)."
)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _selected_by_where(where: Callable, treedef: Any, n: int) -> list[int]:
    probes = treedef.unflatten([LeafProbe(i) for i in range(n)])
    chosen = where(probes)
    found = jax.tree_util.tree_leaves(chosen, is_leaf=lambda x: x is None)
    indices = []
    for i, node in enumerate(found):
        if not isinstance(node, LeafProbe):
            raise ValueError(
                f"nn.init: `where` returned {node!r} (item {i}), which is not part of "
                "the model; return the arrays (or sub-modules) to initialise, such "
                "as `lambda m: m.layers[0].weight`. A `None` (an absent bias) cannot "
                "be initialised."
            )
        indices.append(node.index)
    return list(dict.fromkeys(indices))


def init(
    model: Any,
    where: Callable[[Any], Any] | None = None,
    initializer: Initializer | None = None,
    *,
    filter: Callable[[Any], bool] | None = None,
    key: Any,
) -> Any:
    """Re-initialise the arrays of `model` selected by `where` (or by `filter`).

    Each selected array `x` is replaced by `initializer(k, shape, x.dtype)`, with a
    different `k` split from `key` for each, in the model's leaf order. Equinox asks
    users to write this with `tree_at`; here it is one call. As for the layers'
    `weight_init=`, `shape` is the array's shape in JAX's convention (fan-in on
    axis -2): a `Linear` or RNN weight stored `(out, in)` is drawn `(in, out)`, a
    convolution's `(out, in, *spatial)` as `(*spatial, in, out)`, and the result is
    stored transposed; other arrays are drawn as stored. `jax.nn.initializers`'
    normal, uniform and variance-scaling initialisers (`lecun_*`, `glorot_*`,
    `he_*`) draw without compiling per shape, and any other initialiser compiles
    once per distinct shape and dtype; the values are those of calling it per
    array.

    **Arguments:**

    - `model`: any pytree (a module).
    - `where`: `model -> node or sequence of nodes`, as for
      [`boxwood.tree_at`][]. A node may be an array or a sub-tree (every array in
      it is selected).
    - `initializer`: `(key, shape, dtype) -> array`: any `jax.nn.initializers`
      function (`jax.nn.initializers.orthogonal()`), or your own.
    - `filter`: instead of `where`, `leaf -> bool`, called on every array of the
      model. (Keyword only.)
    - `key`: a `jax.random` key. (Keyword only.)

    **Returns:**

    A copy of `model` with the selected arrays replaced.

    **Raises:**

    `ValueError` naming the leaf's path if the selection is empty, if the
    initialiser rejects a leaf's shape, or if it returns another shape.

    >>> import boxwood, boxwood.nn as nn, jax
    >>> mlp = nn.MLP(3, 2, 4, 1, key=jax.random.key(0))
    >>> mlp = nn.init(mlp, lambda m: [l.bias for l in m.layers],
    ...               jax.nn.initializers.zeros, key=jax.random.key(1))
    >>> float(abs(mlp.layers[0].bias).sum())
    0.0
    """
    initializer = _checked_initializer(where, filter, initializer)
    flat, treedef = jax.tree_util.tree_flatten_with_path(model)
    leaves = [leaf for _, leaf in flat]
    chosen = _selected_arrays(where, filter, treedef, leaves)
    keys = split_keys(key, len(chosen))
    compiled: dict = {}  # (shape, dtype) -> jitted initialiser, for this call
    for i, k in zip(chosen, keys):
        leaves[i] = _init_leaf(initializer, k, model, flat[i][0], leaves[i], compiled)
    return treedef.unflatten(leaves)


def _checked_initializer(
    where: Callable | None, filter: Callable | None, initializer: Any
) -> Initializer:
    """`initializer`, once exactly one of `where` and `filter` is given and it is a
    function."""
    if (where is None) == (filter is None) or not callable(initializer):
        raise TypeError(
            _MSG_SELECT
            if initializer is None or callable(initializer)
            else "nn.init: `initializer` must be a function `(key, shape, dtype) -> "
            f"array`, got {type(initializer).__name__}."
        )
    return initializer


def _selected_arrays(
    where: Callable | None, filter: Callable | None, treedef: Any, leaves: list
) -> list[int]:
    """The indices of the arrays among `leaves` that `where` (or `filter`) selects;
    raises if there are none."""
    if where is not None:
        chosen = _selected_by_where(where, treedef, len(leaves))
    else:
        assert filter is not None  # exactly one of the two was given
        chosen = [i for i, x in enumerate(leaves) if _is_array(x) and filter(x)]
    chosen = [i for i in chosen if _is_array(leaves[i])]
    if not chosen:
        how = "`where`" if where is not None else "`filter`"
        raise ValueError(
            f"nn.init: {how} selected no arrays of the model; nothing to initialise. "
            "Check it returns arrays such as `m.layers[0].weight` (static fields "
            "and `None` are not arrays)."
        )
    return chosen


def _init_leaf(
    fn: Initializer, key: Any, model: Any, path: tuple, leaf: Any, compiled: dict
) -> Any:
    """The new value of the array `leaf` at `path` in `model`, drawn as its layer
    lays it out (slice by slice for stacked layers)."""
    layout, ndim = layout_at(model, path)
    name = dotted_path(path)
    if ndim is not None and leaf.ndim > ndim:  # stacked layers (`nn.Stacked`)
        return _apply_stacked(fn, key, leaf, name, layout, ndim)
    return _apply_one(fn, key, leaf, name, layout, compiled)


def _draw(fn: Initializer, key: Any, shape: tuple, dtype: Any, compiled: dict) -> Any:
    """`fn(key, shape, dtype)`: on the fast path if `fn` is known, else compiled
    once per (shape, dtype) (falling back to the direct call if `fn` cannot be
    traced)."""
    new = fast_call(fn, key, shape, dtype)
    if new is not None:
        return new
    jitted = compiled.get((shape, dtype))
    if jitted is None:
        jitted = jax.jit(lambda k: fn(k, shape, dtype))
        compiled[(shape, dtype)] = jitted
    if jitted is not False:
        try:
            return jitted(key)
        except jax.errors.JAXTypeError:
            compiled[(shape, dtype)] = False  # not traceable: call it directly
    return fn(key, shape, dtype)


def _apply_stacked(
    fn: Initializer, key: Any, old: Any, path: str, layout: Any, ndim: int
) -> Any:
    """Each layer's slice of a stacked parameter drawn as one parameter (so with
    one layer's fans), with keys split from `key` in the slices' order."""
    lead = old.shape[: old.ndim - ndim]
    flat = old.reshape(-1, *old.shape[old.ndim - ndim :])
    keys = split_keys(key, flat.shape[0])
    compiled: dict = {}
    parts = [
        _apply_one(fn, k, flat[j], f"{path}[{j}]", layout, compiled)
        for j, k in enumerate(keys)
    ]
    return jnp.stack(parts).reshape(*lead, *flat.shape[1:])


def _apply_one(
    fn: Initializer, key: Any, old: Any, path: str, layout: Any, compiled: dict
) -> Any:
    stored, dtype = tuple(old.shape), old.dtype
    shape = drawn_shape(stored, layout)
    seen = "" if shape == stored else f" (stored as {stored})"
    try:
        new = _draw(fn, key, shape, dtype, compiled)
    except Exception as error:
        raise ValueError(
            f"nn.init: the initialiser rejected `{path}` of shape {shape}{seen} and "
            f"dtype {dtype}: {error}. Select fewer leaves with `where`/`filter`."
        ) from error
    if not _is_array(new) or tuple(new.shape) != shape:
        got = getattr(new, "shape", type(new).__name__)
        raise ValueError(
            f"nn.init: the initialiser returned {got} for `{path}`, called with shape "
            f"{shape}{seen}; it must return an array of the shape it is given."
        )
    return to_stored(jnp.asarray(new, dtype), stored, layout)
