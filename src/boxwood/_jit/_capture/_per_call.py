"""Per call: read the watched names, pass the hidden first argument (the values
holding arrays, and the static name that keys the trace-time constants).

`wrap(fun, ...)` returns a `Layer`: the generated function `call` (one dict lookup
or cell read and one identity test per name: when every name is bound to the same
object as on the previous call, the previous hidden argument is passed again). Any
other call goes to `Layer.slow`, which classifies and keys the values again, scans
again when a helper was defined or redefined since the scan (`Reads.stale`), and
takes a new snapshot in one assignment, so that concurrent calls see either
snapshot whole. A changed constant changes the hidden argument's static name, so
the compiled core traces once for it; the same value again finds its code.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import types
from collections.abc import Callable
from typing import Any

from ..._module import as_pytree_function, bind_method
from ..._tracebacks import hide_own_frames
from ._arguments import argument_reads
from ._reads import globals_of, in_home_globals
from ._rebuild import Capture
from ._traced import Traced, traced_for
from ._values import MISSING

# Internal names start with `_bw_` so that they cannot shadow a parameter. The
# free variables of `call` are the same whatever is watched, so that a new scan
# can give the same function new code (`Layer.rewatch`).
_CALL_TEMPLATE = """
def _bw_make(_bw_g, _bw_cells, _bw_fd, _bw_state, _bw_core, _bw_slow, _bw_first):
    def call({params}):
        try:
            _bw_s = _bw_state.snap
            try:
                {reads}
            except (KeyError, ValueError, IndexError):
                if _bw_g is _bw_cells or _bw_g is _bw_first or _bw_g is _bw_fd:
                    return None  # (never: keeps them free variables)
                return _bw_slow({args}, {kwargs})
            if {tests}:
                return _bw_slow({args}, {kwargs})
            {forward}
        except Exception as _bw_error:  # boxwood's frames hidden (`_tracebacks.py`)
            _bw_hide(_bw_error)
            raise
    return call
"""
# With `Layer.route_first`: the first constants (no static name: a hidden
# argument of `None`) go to the compiled code that takes no hidden argument.
_FIRST_ANY = """if _bw_s[{n}] is None:
                if kwargs:
                    return _bw_first(*args, **kwargs)
                return _bw_first(*args)
            """
_FIRST_PLAIN = """if _bw_s[{n}] is None:
                return _bw_first({names})
            """
# `*args, **kwargs` (any signature), or the function's own parameters when it has
# only plain positional ones: no tuple or dict is packed and unpacked on the way
# (about half the layer's cost).
_FORWARD_ANY = """if kwargs:
                return _bw_core({hidden}*args, **kwargs)
            return _bw_core({hidden}*args)"""
_FORWARD_PLAIN = "return _bw_core({hidden}{names})"


def plain_parameters(fun: Any) -> list[str] | None:
    """The parameter names of `fun` when they are all positional-or-keyword, with no
    defaults, `*args`, `**kwargs` or keyword-only ones; otherwise `None`."""
    if type(fun) is not types.FunctionType:
        return None
    code = fun.__code__
    if (
        code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        or code.co_kwonlyargcount
        or code.co_posonlyargcount
        or fun.__defaults__
    ):
        return None
    names = list(code.co_varnames[: code.co_argcount])
    if any(n.startswith("_bw_") for n in names):
        return None
    return names


class CallState:
    """One wrapper's view of its captures: the last values read, and the hidden
    argument made of them."""

    __slots__ = ("snap", "capture")

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.reset()

    def reset(self) -> None:
        """A snapshot no call matches: the next call takes a new one."""
        self.snap: tuple = (MISSING,) * len(self.capture.labels) + (None,)

    def hidden_now(self) -> tuple | None:
        """The hidden argument for the names' current values."""
        return self.capture.hidden(self.capture.read())


def _source(capture: Capture, params: list[str] | None, routed: bool) -> str:
    globals_ = capture.reads.globals
    n = len(capture.labels)
    reads = [f"_bw_v{i} = _bw_g[{name!r}]" for i, name in enumerate(globals_)]
    reads += [
        f"_bw_v{i + len(globals_)} = _bw_cells[{i}].cell_contents"
        for i in range(len(capture.cells))
    ]
    done = len(globals_) + len(capture.cells)
    reads += [  # another file's globals (`_bw_fd`: one dict per name)
        f"_bw_v{i + done} = _bw_fd[{i}][{name!r}]"
        for i, (_, name) in enumerate(capture.foreign)
    ]
    first = f"_bw_s[{n}], "
    if params is None:
        sig, args, kwargs = "*args, **kwargs", "args", "kwargs"
        forward = _FORWARD_ANY.format(hidden=first)
        route = _FIRST_ANY.format(n=n)
    else:
        sig = ", ".join(params)
        args, kwargs = f"({sig}{',' if params else ''})", "{}"
        forward = _FORWARD_PLAIN.format(hidden=first, names=sig)
        route = _FIRST_PLAIN.format(n=n, names=sig)
    if routed:
        forward = route + forward
    return _CALL_TEMPLATE.format(
        params=sig,
        reads="\n                ".join(reads) or "pass",
        args=args,
        kwargs=kwargs,
        tests=" or ".join(f"_bw_v{i} is not _bw_s[{i}]" for i in range(n)) or "False",
        forward=forward,
    )


_RESCAN_LOCK = threading.Lock()


class Layer:
    """What `filter_jit` returns for a function that reads watched names: `call`
    (the generated function that checks them), and the compiled core behind it.

    **Arguments:**

    - `fun`: the user's function or callable object.
    - `capture`: its names (`Capture`).
    - `core`: the compiled wrapper (`JitWrapper`), which takes the hidden argument
      first: of `Traced(fun)` for a function, of `call_keyed` bound to a callable
      object (whose methods' global reads are keyed, never passed).
    """

    def __init__(self, fun: Any, capture: Capture, core: Any) -> None:
        self.fun, self.capture, self.core = fun, capture, core
        self.core_call = core.call
        plain = type(fun) is types.FunctionType
        self.name = self.qualname = callable_name(fun)
        if plain:
            self.name = fun.__name__
        self.params = plain_parameters(fun) if plain else None
        self.state = CallState(capture)
        self.first: Callable | None = None  # see `route_first`
        self.call = self._generate(None)
        capture.layers.add(self)
        core.dispatch.watch_methods = self.traced_with  # see `traced_with`

    def _generate(self, into: Callable | None) -> Callable:
        capture = self.capture
        source = _source(capture, self.params, self.first is not None)
        namespace: dict[str, Any] = {"_bw_hide": hide_own_frames}
        # named inside this package, so that warnings skip the frame (`user_stacklevel`)
        where = os.path.join(os.path.dirname(__file__), f"<captures of {self.name}>")
        exec(compile(source, where, "exec"), namespace)
        cells = tuple(capture.cells)
        foreign = tuple(g for g, _ in capture.foreign)
        call = namespace["_bw_make"](
            capture.g, cells, foreign, self.state, self.core_call, self.slow, self.first
        )
        # errors about the call's arguments name the user's function
        code = call.__code__.replace(co_name=self.name, co_qualname=self.qualname)
        if into is None:
            call.__code__ = code
            call.__name__, call.__qualname__ = self.name, self.qualname
            return call
        old_cells = into.__closure__
        assert old_cells is not None, "`into` is a `_generate`d closure"
        for old, new in zip(old_cells, call.__closure__):
            old.cell_contents = new.cell_contents
        into.__code__ = code
        return into

    def slow(self, args: tuple, kwargs: dict) -> Any:
        """A call after a watched name was bound to another object: the values
        read again, a new snapshot (the next calls are warm again), the call with
        the new hidden argument (a changed constant changes its static name: the
        core traces once for it)."""
        capture, state = self.capture, self.state
        if capture.reads.roots and capture.reads.stale(capture.g):
            self.rescan()
        self.watch_arguments(args, kwargs)
        values = capture.read()
        hidden = capture.hidden(values)
        state.snap = (*values, hidden)
        if hidden is None and self.first is not None:  # see `route_first`
            return self.first(*args, **kwargs)
        return self.core_call(hidden, *args, **kwargs)

    def route_first(self, first: Callable) -> None:
        """Send the calls whose hidden argument is `None` (the first constants of
        a plain function's capture, those `first` was traced with) to `first`,
        which takes no hidden argument; the others to the core."""
        self.first = first
        self._generate(self.call)

    def watch_arguments(self, args: tuple, kwargs: dict) -> None:
        """Watch what the methods of the module arguments read from their
        globals (a notebook's `SCALE` read inside `Model.__call__`, or a
        `layers.py` file's)."""
        extra = argument_reads(args, kwargs)
        if extra and self.capture.extend(extra):
            for layer in list(self.capture.layers):
                layer.rewatch()

    def traced_with(self, name: str, args: tuple, kwargs: dict) -> None:
        """Called by the core when it traces, with the user's arguments: a module
        class not seen by `slow` (the watched values had not changed) has its
        methods' global reads watched from the next call on."""
        del name
        self.watch_arguments(args, kwargs)

    def rescan(self) -> None:
        """Scan the function again (a helper was defined or redefined since the
        last scan); when the watched names changed, every layer of this capture
        reads the new ones."""
        with _RESCAN_LOCK:
            capture = self.capture
            if not capture.reads.stale(capture.g):
                return  # another thread has done it
            fresh = type(self.fun) is types.FunctionType
            new = Capture(self.fun) if fresh else Capture(self.fun, capture.g)
            if capture.adopt(new):
                for layer in list(capture.layers):
                    layer.rewatch()

    def rewatch(self) -> None:
        self.state.reset()
        self._generate(self.call)

    def clear_cache(self) -> None:
        self.core.clear_cache()
        self.state.reset()

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        lower_with = getattr(self.core, "lower_with", None)
        if lower_with is not None:  # the core binds the hidden argument itself
            return lower_with(lambda: (self.state.hidden_now(),), args, kwargs)
        return self.core.lower(self.state.hidden_now(), *args, **kwargs)


def call_keyed(fun: Any, hidden: Any, *args: Any, **kwargs: Any) -> Any:
    """What the core of a callable object given to `filter_jit` runs, bound to it
    (`fun`, a pytree child: its arrays are traced): `fun` called, the hidden
    argument (the static name of the constants its methods read) only keying the
    compiled code."""
    del hidden
    return fun(*args, **kwargs)


def callable_name(fun: Any) -> str:
    """How messages name a function or callable object given to `filter_jit`."""
    if isinstance(fun, functools.partial):
        return f"functools.partial({callable_name(fun.func)})"
    func = getattr(fun, "__func__", None)
    if func is None and not isinstance(fun, types.FunctionType):
        return f"{type(fun).__qualname__}.__call__"
    return getattr(func or fun, "__qualname__", type(fun).__name__)


def wrap(
    fun: Any, variant: Any, make_core: Callable[[Traced], Any], make_plain: Callable
) -> Layer | None:
    """`filter_jit`'s layer for a function that reads values from its closure or
    globals, or for a callable object whose methods read globals:
    `make_core(traced)` compiles `traced(hidden, *args, **kwargs)`,
    `make_plain(bound, labels, name)` compiles `call_keyed` bound to the callable
    object. `None` when nothing is watched. A library's wrapper of the user's
    function (`jax.grad(f)`) is scanned from the user's module
    (`in_home_globals`)."""
    fun = in_home_globals(fun)
    if type(fun) is types.FunctionType:
        traced = traced_for(fun, variant)
        if traced.capture.empty:
            return None
        return Layer(fun, traced.capture, make_core(traced))
    g = globals_of(fun)
    if type(g) is not dict:
        return None
    capture = Capture(fun, g)
    if capture.empty:
        return None
    bound = bind_method(call_keyed, as_pytree_function(fun))
    core = make_plain(bound, capture.labels, callable_name(fun))
    return Layer(fun, capture, core)


def watch_plain(
    fun: Any, variant: Any, core: Any, make_core: Callable, promote: Callable
) -> None:
    """For a function that reads no watched name (`core`: its plain wrapper): when
    it is first traced with module arguments whose methods read globals, it gets
    a layer after all (`promote(layer)` sends the wrapper's calls to the layer's
    from then on, and the layer's calls with the constants of that trace back to
    `core`: `Layer.route_first`), so that rebinding them is seen, with no trace
    more than a change needs."""

    def layer_for(extra: dict) -> Layer:
        traced = traced_for(fun, variant)
        traced.capture.extend(extra)
        return Layer(fun, traced.capture, make_core(traced))

    _watch_arguments(core, layer_for, promote)


def watch_callable(
    fun: Any, core: Any, make_plain: Callable, promote: Callable
) -> None:
    """`watch_plain` for a callable object that reads no watched name (a
    `functools.partial`, a bound method, an object with `__call__`): its layer
    compiles `call_keyed` bound to it, as `wrap` makes one (`make_plain`).
    Where no plain function is reached from `fun` (no globals to scan it in),
    nothing is watched: the dispatch keeps warning at the first trace about
    its module arguments' methods."""
    g = globals_of(fun)
    if type(g) is not dict:
        return

    def layer_for(extra: dict) -> Layer:
        capture = Capture(fun, g, own=True)
        capture.extend(extra)
        bound = bind_method(call_keyed, as_pytree_function(fun))
        return Layer(
            fun, capture, make_plain(bound, capture.labels, callable_name(fun))
        )

    _watch_arguments(core, layer_for, promote)


def _watch_arguments(core: Any, layer_for: Callable, promote: Callable) -> None:
    """At each trace of `core`: the globals read by its module arguments'
    methods (`argument_reads`); at the first that finds any, `promote(layer)`
    with `layer_for(reads)`, and later module classes watched by that layer."""
    promoted: list[Layer] = []

    def traced_with(name: str, args: tuple, kwargs: dict) -> None:
        del name
        if promoted:  # a module class not seen before: watched from now on
            promoted[0].watch_arguments(args, kwargs)
            return
        extra = argument_reads(args, kwargs)
        if not extra:
            return
        layer = layer_for(extra)
        promoted.append(layer)
        promote(layer)

    core.dispatch.watch_methods = traced_with
