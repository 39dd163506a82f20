"""The warm path of a `filter_jit` wrapper: the one function that runs on every
call.

`warm_call(dispatch)` makes it, as a closure (a plain function is called through
CPython's vectorcall, cheaper than an object's `__call__`, and it binds like a
method when used as a class attribute). A call: the key of its arguments
(`call_key`, `_module/_flat_key.py`: no flatten, no treedef hash, no type check),
one lookup in `Store.fast_plans` for `(plan, entry)`, the inner `jax.jit` called
on the arrays (JAX's own C++ cache handles shapes and dtypes), the output built. Anything
else goes to the dispatch (`_dispatch.py`): an unknown key to its slow path, a
call while another thread traces this function to its locked path. A trace during
the call (new shapes) is seen as the store's trace count moving.

`fast_plans` holds only entries whose first call has completed, so the warm path
needs no test for a cold entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._module import call_key
from .._tracebacks import hide_own_frames
from . import _convention
from ._diagnostics import deleted_input
from ._dispatch import Dispatch


def warm_call(dispatch: Dispatch) -> Callable:
    """The per-call function of `dispatch`'s wrapper (see the module docstring).
    Its free variables are the same for every dispatch, so that a new one's can be
    moved into an existing function (`rebind`). It counts its own hits in its
    free variable `hits` (`warm_hits`): the cheapest count Python has."""
    store = dispatch.store
    fast_plans: dict[Any, Any] = store.fast_plans  # (a `None` key finds nothing)
    slow = dispatch.call_slow
    locked = dispatch.call_locked
    after_trace = dispatch.after_trace
    on_error = dispatch.on_error
    output = dispatch.output
    invoke = dispatch.invoke
    hits = 0  # warm hits (`warm_hits` reads it; the dispatch counts its own)
    plain = dispatch.conv == _convention.PLAIN  # the inner jit takes `(dyn)`
    by_name = dispatch.leading.first_name is not None
    key_of = call_key

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal hits
        # one `try` around the whole body: free unless something is raised
        try:
            if by_name and kwargs:  # the first argument, by keyword: positional
                args, kwargs = dispatch.leading.positional(args, kwargs)
            dyn: list = []
            found = fast_plans.get(key_of(args, kwargs, dyn))  # (`None`: not walked)
            if found is None:
                return slow(args, kwargs)
            plan, entry = found
            if store.tracing:
                return locked(plan, entry, dyn, args, kwargs)
            traces = store.traces
            try:
                if plain:
                    result = entry.jitted(dyn)
                else:
                    result = invoke(entry.jitted, dyn, plan)
            except BaseException as error:
                on_error(error)  # raises a failed `error_if` check's error
                raise
            if store.traces != traces:
                after_trace(args, kwargs, plan)
            else:
                hits += 1
            build = entry.fast_build
            if build is not None:
                return build(result)
            return output(entry, dyn, result)
        except Exception as error:  # boxwood's frames hidden, as JAX hides its own
            clear = deleted_input(args, kwargs)  # the same words on every backend
            if clear is not None:
                hide_own_frames(clear)
                raise clear from error
            hide_own_frames(error)
            raise

    return call


def _hits_cell(call: Callable) -> Any:
    closure = call.__closure__ or ()
    return closure[call.__code__.co_freevars.index("hits")]


def warm_hits(call: Callable) -> int:
    """The calls that `call`, made by `warm_call`, served from compiled code."""
    return _hits_cell(call).cell_contents


def reset_hits(call: Callable) -> None:
    _hits_cell(call).cell_contents = 0


def rebind(call: Callable, dispatch: Dispatch) -> None:
    """Give `call`, made by `warm_call`, the free variables of a new
    `warm_call(dispatch)` in place (the user holds `call`), keeping its count."""
    fresh = warm_call(dispatch)
    names = call.__code__.co_freevars
    for name, old, new in zip(names, call.__closure__ or (), fresh.__closure__ or ()):
        if name != "hits":
            old.cell_contents = new.cell_contents


def detour(call: Callable, first: Callable[[tuple, dict], Any]) -> None:
    """Send every call of `call`, made by `warm_call`, to `first(args, kwargs)`
    until `rebind` gives it its free variables again."""
    names = call.__code__.co_freevars
    for name, cell in zip(names, call.__closure__ or ()):
        if name == "fast_plans":
            cell.cell_contents = {}  # no key is found
        elif name == "key_of":  # ... and none is made
            cell.cell_contents = _no_key
        elif name == "slow":
            cell.cell_contents = first


def _no_key(args: tuple, kwargs: dict, dyn: list) -> None:
    return None
