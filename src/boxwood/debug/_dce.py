"""`store_dce` and `inspect_dce`: which arrays did the compiler remove as dead code?"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.core

from .._filters import is_array
from .._pretty import array_summary, tree_pformat
from .._transforms import Slots


class _Shown:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Record:
    """One traced `store_dce` call: its pytree, and the summary of each array
    whose callback ran (the arrays that survived dead-code elimination)."""

    __slots__ = ("arrays", "summaries")

    def __init__(self, x: Any) -> None:
        self.arrays = Slots(x, is_array)
        self.summaries: dict[int, str] = {}

    def marked(self) -> list:
        """The arrays of `x`, each passed through a callback that records it."""
        return [
            jax.pure_callback(self._recorder(n), a, a, vmap_method="expand_dims")
            for n, a in enumerate(self.arrays.picked())
        ]

    def _recorder(self, n: int) -> Any:
        def record(value: Any) -> Any:
            self.summaries[n] = array_summary(value).replace("(numpy)", "")
            return value

        return record

    def shown(self) -> Any:
        """`x` with each array's summary, or `<DCE'd>` for a removed one."""
        count = len(self.arrays.where)
        return self.arrays.rebuild(
            [_Shown(self.summaries.get(n, "<DCE'd>")) for n in range(count)]
        )


# name -> the calls traced under that name. Grows with the number of `store_dce`
# calls traced, which a user makes only while debugging; `inspect_dce` does not
# clear it.
_RECORDS: dict[Hashable, list[_Record]] = {}


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
    record = _Record(x)
    _RECORDS.setdefault(name, []).append(record)
    return record.arrays.rebuild(record.marked())


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
    records = _RECORDS.get(name, [])
    plural = "" if len(records) == 1 else "s"
    print(f"Found {len(records)} call{plural} to `store_dce`.")
    for i, record in enumerate(records):
        print(f"Entry {i}:")
        print(tree_pformat(record.shown()))
