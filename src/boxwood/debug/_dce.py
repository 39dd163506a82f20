"""`store_dce` and `inspect_dce`: which arrays did the compiler remove as dead code?"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.core

from .._filters import combine, is_array, partition
from .._pretty import array_summary, tree_pformat

# name -> list of (seen shapes by leaf index, treedef, non-array part), one per call
# site traced. Bounded by the number of `store_dce` calls traced, which a user makes
# only while debugging; `inspect_dce` does not clear it.
_STORE: dict[Hashable, list] = {}


class _Shown:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _alive(seen: dict, i: int) -> Any:
    def record(x: Any) -> Any:
        seen[i] = array_summary(x).replace("(numpy)", "")
        return x

    return record


def _inside_trace() -> bool:
    return isinstance(jax.numpy.asarray(1) + 1, jax.core.Tracer)


def store_dce(x: Any, name: Hashable = None) -> Any:
    """Return `x` unchanged, recording (when the compiled program runs) which of its
    arrays survived dead-code elimination; see [`boxwood.debug.inspect_dce`][].

    Must be called inside `jax.jit` / `filter_jit`.

    **Arguments:**

    - `x`: any pytree; its arrays are checked.
    - `name`: a hashable label, to inspect this call site alone.

    **Returns:**

    `x`.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> @jax.jit
    ... def f(x):
    ...     a, b = boxwood.debug.store_dce((x * 2, x + 1), name="doc")
    ...     return a
    >>> _ = f(jnp.ones(3))
    >>> boxwood.debug.inspect_dce(name="doc")
    Found 1 call to `store_dce`.
    Entry 0:
    (f32[3], <DCE'd>)
    """
    if not _inside_trace():
        raise RuntimeError(
            "`store_dce` must be called inside `jax.jit` or `boxwood.filter_jit`: "
            "dead code is only removed by the compiler."
        )
    arrays, others = partition(x, is_array)
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    seen: dict[int, str] = {}
    _STORE.setdefault(name, []).append((seen, treedef, others))
    leaves = [
        jax.pure_callback(_alive(seen, i), a, a, vmap_method="expand_dims")
        for i, a in enumerate(leaves)
    ]
    return combine(jax.tree_util.tree_unflatten(treedef, leaves), others)


def inspect_dce(name: Hashable = None) -> None:
    """Print what [`boxwood.debug.store_dce`][] recorded: each array's summary, or
    `<DCE'd>` if the compiler removed it.

    Call it outside of any `jit`, after running the compiled function.

    **Arguments:**

    - `name`: the label given to `store_dce`.

    **Returns:**

    `None`; prints to standard output.
    """
    if _inside_trace():
        raise RuntimeError("`inspect_dce` must be called outside of `jax.jit`.")
    entries = _STORE.get(name, [])
    print(
        f"Found {len(entries)} call{'' if len(entries) == 1 else 's'} to `store_dce`."
    )
    for i, (seen, treedef, others) in enumerate(entries):
        shown = [_Shown(seen.get(j, "<DCE'd>")) for j in range(treedef.num_leaves)]
        print(f"Entry {i}:")
        print(
            tree_pformat(combine(jax.tree_util.tree_unflatten(treedef, shown), others))
        )
