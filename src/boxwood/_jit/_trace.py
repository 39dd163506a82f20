"""What `filter_jit`'s inner `jax.jit` runs: the user's function, rebuilt around
the traced leaves of one plan and its static leaves.

`traced_function` makes the function handed to `jax.jit` for one `Entry`: it takes
the flat lists of arrays of the calling convention (`_convention.py`), rebuilds the
arguments (`Plan.treedef` and the entry's static leaves), reports the trace
(`_diagnostics.on_trace`: counts and recompile explanations), runs the function,
records the output structure on the entry (`Out`) and returns the output arrays.
Everything here runs only while JAX traces, never on a warm call.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import jax

from .._filters import is_array
from . import _convention, _shardings
from ._cache import Entry, Out, Plan, Store, merge, signature
from ._diagnostics import on_trace, rename_arguments, silence_donation_warning
from ._options import JitOptions


def traced_function(
    fun: Any,
    store: Store,
    plan: Plan,
    statics: tuple,
    entry: Entry,
    *,
    options: JitOptions,
    name: str,
    conv: Any,
    leading: _convention.Leading,
    watch_methods: Callable[[str, tuple, dict], None] | None,
) -> Callable:
    """The function `jax.jit` compiles for `entry` of `plan` (static leaves
    `statics`) of the wrapper of `fun` named `name`. `leading`: how its positional
    arguments begin (the hidden argument of captured values); `watch_methods`:
    told at each trace the function name and the user's arguments, to watch
    (or warn about) what methods of module arguments read from globals
    (`_capture/`)."""
    # JAX's "not usable" warning is replaced by `warn_undonated` ("warn" modes),
    # which names the buffers, or dropped ("all" modes)
    silence = options.donates
    entry_ref = weakref.ref(entry)
    out_shardings = options.jit_kwargs().get("out_shardings")

    def inner(*groups):
        fun_dyn, dyn = _convention.unpack(conv, groups)
        leaves = merge(plan.n, plan.dyn_idx, dyn, plan.static_idx, statics)
        if plan.kw:
            args, kwargs = plan.treedef.unflatten(leaves)
        else:
            args, kwargs = plan.treedef.unflatten(leaves), {}
        function = store.function(fun_dyn)
        on_trace(options, name, store, args, kwargs, leading.labels, _own(function))
        if watch_methods is not None:  # (captured modules are watched already)
            watch_methods(name, leading.user_args(args), kwargs)
        store.begin_trace()
        try:
            out = function(*args, **kwargs)
        except Exception as error:  # name the caller's paths, not `groups[0][3]`
            rename_arguments(error, conv, plan, args, kwargs, function)
            raise
        finally:
            store.end_trace()
        if out_shardings is not None:
            out = _shardings.constrain_output(out_shardings, out)
        arrays = _record_output(out, entry_ref(), signature([*fun_dyn, *dyn]))
        if len(arrays) == 1 and has_side_effects(arrays):
            arrays.append(jax.numpy.zeros((), bool))  # (see `has_side_effects`)
        if silence:  # JAX warns while lowering, right after this returns
            silence_donation_warning()
        return arrays

    inner.__qualname__ = name
    inner.__name__ = name.rsplit(".", 1)[-1]
    # JAX names the traced function by its code's location: the user's, with the
    # inner signature kept for JAX's argument names
    inner.__signature__ = inspect.signature(inner)  # type: ignore[attr-defined]
    source = _source_function(fun)
    if source is not None:
        inner.__wrapped__ = source  # type: ignore[attr-defined]
    return inner


def has_side_effects(arrays: list) -> bool:
    """Whether the trace that computed `arrays` holds an operation with a side
    effect (`jax.debug.print`, `io_callback`, ...).

    A program whose one output is also reduced for a side effect
    (`jax.debug.print("{}", y.sum())` beside `return y`) fails to compile on
    XLA's CPU backend (jaxlib 0.10: "RET_CHECK failure ... is live and cannot be
    removed", under plain `jax.jit` too; it compiles with XLA's YNNPACK fusion
    off, `--xla_cpu_experimental_ynn_fusion_type=`). With a second output it
    compiles (Equinox's wrapper always returns one), so such a program gets an
    unused scalar after its one output; the output builders read the leading
    results only. Programs without side effects, where the extra output would
    only cost time, are left as they are.

    JAX keeps the equations of a trace with effects by strong reference and the
    others by weak reference (dead code is dropped); that list is not public, so
    on a JAX without it this answers `False`."""
    try:
        from jax.extend.core import find_top_trace

        equations = find_top_trace(arrays).frame.tracing_eqns
    except (ImportError, AttributeError):
        return False
    return any(
        not isinstance(e, weakref.ReferenceType) and getattr(e, "effects", None)
        for e in equations
    )


def _record_output(out: Any, entry: Entry | None, shapes: Any) -> list:
    """The arrays of `out`, the traced output, after recording its structure and
    static leaves (`Out`) on `entry` for the input `shapes` (`signature`)."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    mask = [is_array(x) for x in leaves]
    static_idx = tuple(i for i, m in enumerate(mask) if not m)
    if entry is not None:
        entry.record(
            shapes, Out(treedef, static_idx, tuple(leaves[i] for i in static_idx))
        )
    return [x for x, m in zip(leaves, mask) if m]


def _source_function(fun: Any) -> Any:
    """The Python function whose code `fun` runs (for JAX's messages), or None."""
    own_call = type(fun).__call__ if callable(fun) else None
    for candidate in (getattr(fun, "__func__", fun), own_call):
        if hasattr(candidate, "__code__"):
            return candidate
    return None


def _own(function: Any) -> bool:
    """Whether `function` (or the function of a bound method) is boxwood's own,
    such as `generate`'s decoding loop: its recompiles are not the user's to
    read about in a note."""
    module = getattr(getattr(function, "__func__", function), "__module__", None)
    return isinstance(module, str) and module.startswith("boxwood.")
