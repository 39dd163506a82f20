"""`filter_checkpoint`: rematerialisation for functions of arbitrary pytrees."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import jax
from jax.core import Tracer
from jax.extend.core import get_opaque_trace_state

from .._caches import register_cache_clear
from .._filters import combine, is_array, partition
from .._module import ValueKey, as_pytree_function, field
from ._split import OutBox, split_out
from ._wrapped import Wrapped

# The checkpointed functions each live wrapper made in the trace it was last called
# in, by the wrapper's `id` (held outside it, which stays picklable): the calls of
# one trace (an unrolled stack's layers) share them; a call in another trace, or
# an eager one, makes its own, so that what the function reads (a global rebound
# between calls) is read again.
_FUNCTIONS: dict[int, tuple[Any, dict]] = {}
_KEPT = 64  # the most kept per wrapper and trace


@register_cache_clear
def _clear_functions() -> None:
    _FUNCTIONS.clear()


def _kept(wrapper: Any, arrays: list) -> dict | None:
    """The functions `wrapper` made in the current trace (`None` for a call that
    traces nothing: the arrays are concrete)."""
    if not any(isinstance(x, Tracer) for x in arrays):
        return None
    state = get_opaque_trace_state()
    entry = _FUNCTIONS.get(id(wrapper))
    if entry is None:
        weakref.finalize(wrapper, _FUNCTIONS.pop, id(wrapper), None)
    elif entry[0] == state:
        return entry[1]
    kept: dict = {}
    _FUNCTIONS[id(wrapper)] = (state, kept)
    return kept


def _call_key(arrays: list, layout: Any, static: Any) -> tuple:
    """What a call's trace depends on: the static leaves (`ValueKey`: `True` and
    `1` apart; by identity where unhashable) and structure, and the arrays'
    structure and types."""
    leaves, treedef = jax.tree_util.tree_flatten(static)
    return (
        treedef,
        tuple(ValueKey(leaf) for leaf in leaves),
        layout,
        tuple(jax.typeof(x) for x in arrays),
    )


class _Checkpointed(Wrapped):
    prevent_cse: bool = field(static=True)
    policy: Callable | None = field(static=True)

    def _checkpointed(self, dynamic: Any, static: Any) -> tuple[Callable, OutBox]:
        """`jax.checkpoint` of the call with these static parts, and the box its
        trace fills: within one trace, the same function for calls alike
        (`_call_key`), so that JAX traces it, and differentiates and batches its
        jaxpr, once: a loop of identical layers (`Stacked` unrolled) costs one
        layer's trace."""
        arrays, layout = jax.tree_util.tree_flatten(dynamic)
        kept = _kept(self, arrays)
        key = found = None
        if kept is not None:
            key = _call_key(arrays, layout, static)
            try:
                found = kept.get(key)
            except (TypeError, ValueError):  # a static leaf's `==` gave no bool
                key = None
        if found is not None:
            return found
        box = OutBox()

        def run(dyn: Any) -> Any:
            f, a, kw = combine(dyn, static)
            return split_out(f(*a, **kw), box)

        made = jax.checkpoint(run, prevent_cse=self.prevent_cse, policy=self.policy)
        if kept is not None and key is not None:
            if len(kept) >= _KEPT:
                kept.clear()
            kept[key] = (made, box)
        return made, box

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamic, static = partition((self.fun, args, kwargs), is_array)
        remat, box = self._checkpointed(dynamic, static)
        out_dynamic = remat(dynamic)
        return combine(out_dynamic, box.get())


def filter_checkpoint(
    fun: Callable | None = None,
    *,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Callable:
    """`jax.checkpoint` (gradient checkpointing) for functions of arbitrary pytrees.

    Under reverse-mode differentiation, the intermediate values of `fun` are not
    stored for the backward pass but recomputed, trading compute for memory. The
    arrays of the arguments (and of `fun`, when it is a module or a bound method of
    one) are traced; every other leaf is static. Usable as `@filter_checkpoint` or
    `@filter_checkpoint(policy=...)`.

    **Arguments:**

    - `fun`: the function, called as `fun(*args, **kwargs)`; it may return any
      pytree (its non-array leaves are returned as they are).
    - `prevent_cse`: as in `jax.checkpoint`: stop XLA from merging the recomputation
      with the original computation.
    - `policy`: as in `jax.checkpoint`, one of `jax.checkpoint_policies`, choosing
      which intermediates may be saved rather than recomputed.

    **Returns:**

    The checkpointed function. Called again within one trace with the same
    static parts and array types (the layers of an unrolled
    [`boxwood.nn.Stacked`][]), it reuses that trace, which JAX then
    differentiates and batches once; a call in another trace, or an eager one,
    traces it again, reading what it reads afresh.
    """
    if fun is None:
        return functools.partial(
            filter_checkpoint, prevent_cse=prevent_cse, policy=policy
        )
    return _Checkpointed(as_pytree_function(fun), prevent_cse, policy)
