"""Ahead-of-time compilation: `filter_jit(f).lower(*args).compile()`.

`Lowered` and `Compiled` follow JAX's stages but are called as `f` is: with the
same arguments (modules, pytrees, Python objects), returning `f`'s output. JAX's
own objects, which take the inner function's flat lists of arrays, stay available
as `.flat` on both. Both call their program through an `AotCall`: `JitCall` for
`filter_jit`; `filter_pmap` brings its own (`boxwood/_transforms/_pmap.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .._errors import raise_as_boxwood_error
from .._tracebacks import hide_own_frames
from . import _convention
from ._diagnostics import restore_warnings


class AotCall(Protocol):
    """What `Lowered` and `Compiled` need of the wrapper that lowered: its `name`,
    and a call of the compiled program `flat` with the wrapper's arguments."""

    name: str

    def __call__(self, flat: Any, args: tuple, kwargs: dict) -> Any: ...


class Lowered:
    """What `filter_jit(f).lower(*args, **kwargs)` returns.

    - `compile(compiler_options=None)`: a `Compiled` taking `f`'s
      arguments.
    - `as_text()`, `compiler_ir()`, `cost_analysis()` and every other attribute of
      JAX's `jax.stages.Lowered` are read from `flat`.
    - `flat`: JAX's `Lowered` of the inner function, which takes flat lists of the
      arguments' arrays.
    """

    def __init__(self, flat: Any, call: AotCall) -> None:
        self.flat = flat
        self._call = call

    def compile(self, compiler_options: dict | None = None, **kwargs: Any) -> Compiled:
        if compiler_options is not None:
            kwargs["compiler_options"] = compiler_options
        return Compiled(self.flat.compile(**kwargs), self._call)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("flat", "_call"):
            raise AttributeError(name)
        return getattr(self.flat, name)

    def __repr__(self) -> str:
        return f"Lowered({self._call.name})"


class Compiled:
    """What `filter_jit(f).lower(*args).compile()` returns: call it with arguments
    like those given to `lower` (the same structure and non-array values; arrays of
    the same shapes and dtypes) to run the compiled code and get `f`'s output.

    Other arguments raise a `TypeError` saying what differs. `flat` is JAX's
    `jax.stages.Compiled`, which takes the inner function's flat lists of arrays;
    its other attributes (`as_text()`, `cost_analysis()`, ...) are read from there.
    """

    def __init__(self, flat: Any, call: AotCall) -> None:
        self.flat = flat
        self._call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._call(self.flat, args, kwargs)
        except Exception as error:  # boxwood's frames hidden, as JAX hides its own
            hide_own_frames(error)
            raise

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("flat", "_call"):
            raise AttributeError(name)
        return getattr(self.flat, name)

    def __repr__(self) -> str:
        return f"Compiled({self._call.name})"


class JitCall:
    """Calls a JAX-compiled inner function with a call's arguments: picks their
    arrays as the wrapper's dispatch does and checks that the rest matches the
    lowering."""

    def __init__(
        self, dispatch: Any, prefix: Callable[[], tuple], plan: Any, key: Any
    ) -> None:
        self.dispatch = dispatch
        self.prefix = prefix  # the captured values' hidden argument, or ()
        self.plan = plan
        self.key = key
        self.name = dispatch.name

    def __call__(self, flat: Any, args: tuple, kwargs: dict) -> Any:
        from ._dispatch import prepare

        dispatch = self.dispatch
        args = (*self.prefix(), *args)
        args, kwargs, plan, statics, dyn = prepare(dispatch, args, kwargs)
        if plan is not self.plan or plan.key_of(statics) != self.key:
            raise TypeError(
                f"The compiled `{self.name}` was lowered for other arguments: their "
                "structure or non-array values (static arguments) differ from those "
                f"given to `.lower(...)`. Call `{self.name}(...)` itself, which "
                "compiles for these arguments, or `.lower(...)` them again."
            )
        entry = plan.only if plan.get_statics is None else plan.entries[self.key]
        fun_dyn = dispatch.fun_dyn
        try:
            result = _convention.call(dispatch.conv, flat, fun_dyn, dyn, plan.n_first)
        except BaseException as error:
            restore_warnings()
            raise_as_boxwood_error(error)
            raise
        return entry.output(fun_dyn, dyn, result)
