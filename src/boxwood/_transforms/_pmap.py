"""`filter_pmap`: `jax.pmap` over the arrays of arbitrary pytrees."""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._filters import is_array
from .._jit import Lowered
from .._module import as_pytree_function, field
from ._split import OutBox
from ._vmap import UNMAPPED, if_array, named_axes, parameter_names, resolve_axes
from ._wrapped import Wrapped

_EACH_ARRAY = if_array(0)  # the default axes: every array on its leading axis
_CACHE_SIZE = 256  # compiled programs kept (least recently used dropped)


# Compiled programs of every wrapper, most recently used last: wrappers of the same
# function with the same options share them (`filter_pmap(filter_grad(f))` made
# anew each step compiles once).
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()


class _Cache:
    """Identifies one wrapper in the shared cache where its options cannot be
    hashed (hashed by id, so it can sit in a static field)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: collections.OrderedDict = collections.OrderedDict()


def _struct(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


class _Entry:
    """One compiled program: the `jax.pmap` of the arrays, the output's structure
    with its non-array leaves, each output array's axis (`None`: unmapped, taken
    from the first device), and the stand-in mapped input when no input is mapped."""

    __slots__ = ("pmapped", "out_def", "out_kinds", "unmapped", "dummy")


class _Array:
    """Marks an output array's place in `_Entry.out_kinds`."""

    __slots__ = ()


_ARRAY = _Array()


def _split_output(out: Any, out_axes: Any) -> tuple[Any, list, list, list]:
    """`(out_def, kinds, axes, arrays)` for one device's output `out`: its structure;
    its leaves, with `_ARRAY` in place of each one returned as an array; and the
    arrays returned (its arrays and the Python numbers given an axis) with their
    axes (`None`: unmapped)."""
    out_axes = resolve_axes(out_axes, out, "out_axes", "the output")
    out_leaves, out_def = jax.tree_util.tree_flatten(out)
    pairs = list(zip(out_leaves, out_axes))
    kinds = [x if a is UNMAPPED and not is_array(x) else _ARRAY for x, a in pairs]
    axes = [
        None if a is UNMAPPED else a
        for x, a in pairs
        if is_array(x) or a is not UNMAPPED
    ]
    arrays = [jnp.asarray(x) for x, a in pairs if is_array(x) or a is not UNMAPPED]
    return out_def, kinds, axes, arrays


class _Pmapped(Wrapped):
    in_axes: Any
    out_axes: Any
    axis_name: Hashable | None = field(static=True)
    axis_size: int | None = field(static=True)
    donate: str = field(static=True)
    cache: _Cache = field(static=True)
    pmapkwargs: tuple = field(static=True, default=())  # sorted (name, value) pairs
    param_names: tuple[str, ...] | None = field(static=True, default=None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry, leaves, mapped = self._entry(args, kwargs)
        with warnings.catch_warnings():
            if self.donate == "all":  # as Equinox: "all" silences unusable donations
                warnings.filterwarnings("ignore", "Some donated buffers")
            arrays = entry.pmapped(*self._inputs(entry, leaves, mapped))
        return self._output(entry, arrays)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower for these arguments without running: `.compile()` gives an object
        called with the same arguments as this function (see `filter_jit`'s
        `lower`); JAX's own stages are `.flat`."""
        entry, leaves, mapped = self._entry(args, kwargs)
        flat = entry.pmapped.lower(*self._inputs(entry, leaves, mapped))
        return Lowered(flat, _PmapAotCall(self, entry))

    def _entry(self, args: tuple, kwargs: dict) -> tuple[_Entry, list, tuple]:
        if kwargs:
            raise TypeError(
                "Functions parallelised with `filter_pmap` take positional arguments "
                f"only; got keyword arguments {sorted(kwargs)}. Pass them by position "
                "(use `in_axes=dict(name=axis)` to choose axes by argument name)."
            )
        in_axes = self.in_axes
        if isinstance(in_axes, dict):
            in_axes = named_axes(self.param_names, in_axes, len(args))
        axes = resolve_axes(in_axes, args, "in_axes", "args")
        # The function's own arrays (a module, a bound method's module) are inputs
        # too, broadcast to every device; its other leaves are compiled in.
        leaves, treedef = jax.tree_util.tree_flatten((self.fun, args))
        axes = [UNMAPPED] * (len(leaves) - len(axes)) + axes
        # Every array is an argument of the pmapped function (unmapped ones with
        # axis None: broadcast to every device); the rest is compiled in.
        mapped = tuple(i for i, x in enumerate(leaves) if is_array(x))
        static = tuple(x for x in leaves if not is_array(x))
        dev_axes = tuple(None if axes[i] is UNMAPPED else axes[i] for i in mapped)
        shapes = tuple((leaves[i].shape, leaves[i].dtype) for i in mapped)
        key = (self._options_key(), treedef, mapped, dev_axes, static, shapes)
        try:
            entry = _PROGRAMS.pop(key)
        except TypeError:
            raise TypeError(
                "`filter_pmap`: every non-array argument must be hashable (they are "
                "compiled into the program)."
            ) from None
        except KeyError:
            entry = self._compile(leaves, treedef, mapped, list(dev_axes))
        _PROGRAMS[key] = entry
        while len(_PROGRAMS) > _CACHE_SIZE:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        return entry, leaves, mapped

    def _options_key(self) -> Any:
        """What besides the arguments decides the program: the options, or this
        wrapper itself where they cannot be hashed (e.g. a dict of `out_axes`)."""
        key = (self.out_axes, self.axis_name, self.axis_size, self.donate)
        try:
            hash(key)
        except TypeError:
            return self.cache
        return (*key, self.pmapkwargs)

    @staticmethod
    def _inputs(entry: _Entry, leaves: list, mapped: tuple) -> tuple:
        return [leaves[i] for i in mapped], entry.dummy

    @staticmethod
    def _output(entry: _Entry, arrays: list) -> Any:
        arrays = iter(
            x[0] if unmapped else x for x, unmapped in zip(arrays, entry.unmapped)
        )
        out = [next(arrays) if k is _ARRAY else k for k in entry.out_kinds]
        return jax.tree_util.tree_unflatten(entry.out_def, out)

    def _compile(self, leaves: list, treedef: Any, mapped: tuple, axes: list):
        box = OutBox()
        template = [None if i in mapped else x for i, x in enumerate(leaves)]

        def per_device(mapped_leaves: list, _dummy: Any) -> list:
            new = list(template)
            for i, x in zip(mapped, mapped_leaves):
                new[i] = x
            fun, args = jax.tree_util.tree_unflatten(treedef, new)
            out_def, kinds, axes_out, arrays = _split_output(fun(*args), self.out_axes)
            box.put((out_def, kinds, axes_out))
            return arrays

        entry = _Entry()
        size = self.axis_size
        has_mapped = any(a is not None for a in axes)
        if not has_mapped and size is None:
            raise ValueError(
                "`filter_pmap`: no argument is mapped (every `in_axes` leaf resolved "
                "to None), so the number of devices is unknown. Pass `axis_size=`."
            )
        # jax.pmap needs a mapped input: a stand-in of one element per device
        # (`size` is not None without a mapped input: checked above)
        entry.dummy = None if has_mapped or size is None else np.zeros((size,), np.int8)
        dummy_axis = None if has_mapped else 0
        # The output's structure and axes first (an abstract trace, vectorised
        # under the same axis name so that collectives trace), so that `jax.pmap`
        # puts every output array on its axis itself.
        inputs = ([_struct(leaves[i]) for i in mapped], entry.dummy)
        jax.eval_shape(
            jax.vmap(
                per_device,
                in_axes=(axes, dummy_axis),
                axis_name=self.axis_name,
                axis_size=size,
            ),
            *inputs,
        )
        entry.out_def, entry.out_kinds, out_axes = box.get()
        entry.unmapped = [a is None for a in out_axes]
        entry.pmapped = jax.pmap(
            per_device,
            in_axes=(axes, dummy_axis),
            out_axes=[0 if a is None else a for a in out_axes],
            axis_name=self.axis_name,
            axis_size=size,
            donate_argnums=(0,) if self.donate in ("all", "warn") else (),
            **dict(self.pmapkwargs),
        )
        return entry


class _PmapAotCall:
    """Calls a compiled `filter_pmap` program with the function's arguments."""

    def __init__(self, wrapper: _Pmapped, entry: _Entry) -> None:
        self.wrapper = wrapper
        self.entry = entry
        self.name = wrapper.__name__

    def __call__(self, flat: Any, args: tuple, kwargs: dict) -> Any:
        entry, leaves, mapped = self.wrapper._entry(args, kwargs)
        if entry is not self.entry:
            raise TypeError(
                f"The compiled `{self.name}` was lowered for other arguments: their "
                "structure or non-array values (static arguments) differ from those "
                f"given to `.lower(...)`. Call `{self.name}(...)` itself, which "
                "compiles for these arguments, or `.lower(...)` them again."
            )
        return self.wrapper._output(
            entry, flat(*self.wrapper._inputs(entry, leaves, mapped))
        )


def filter_pmap(
    fun: Callable | None = None,
    *,
    in_axes: Any = _EACH_ARRAY,
    out_axes: Any = _EACH_ARRAY,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: str = "none",
    **pmapkwargs: Any,
) -> Callable:
    """Parallelise a function across devices, like `jax.pmap`, for pytree arguments.

    Arrays are split along their mapped axis (one slice per device); every other leaf
    is compiled in as a constant. Usable as `@filter_pmap` or `@filter_pmap(...)`.

    **Arguments:**

    - `fun`: the function, called as `fun(*args)`.
    - `in_axes`, `out_axes`: as for [`boxwood.filter_vmap`][] (`in_axes` may be a
      dict naming positional parameters). An output array given `None` is taken
      from the first device; a Python number given an axis is broadcast. The
      arrays of `fun` itself (a module, a bound method's module) are given to
      every device whole.
    - `axis_name`: the name of the device axis, for collectives (`jax.lax.psum`).
    - `axis_size`: the number of devices; needed only when no input is mapped.
    - `donate`: `"none"`; `"all"` (donate the input arrays' buffers, those of
      `fun` itself included as in `filter_jit`, silencing
      JAX's warning about buffers it could not reuse); or `"warn"` (donate, and let
      that warning through).
    - `**pmapkwargs`: other options of `jax.pmap` (`devices`, `backend`, ...).

    The result has `.lower(*args)`, whose `.compile()` is called with the same
    arguments as the function (as for [`boxwood.filter_jit`][]).

    **Returns:**

    The parallelised function. Each distinct set of non-array arguments and
    argument shapes is compiled once, shared by wrappers of the same function with
    the same options; the 256 most recently used programs are kept.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> f = boxwood.filter_pmap(lambda x, k: x * k)
    >>> f(jnp.ones((jax.local_device_count(), 2)), 3).shape[1]
    2
    """
    _check_donate(donate)
    if fun is None:
        return functools.partial(
            filter_pmap, in_axes=in_axes, out_axes=out_axes, axis_name=axis_name,
            axis_size=axis_size, donate=donate, **pmapkwargs,
        )  # fmt: skip
    options = tuple(
        (k, tuple(v) if isinstance(v, list) else v)
        for k, v in sorted(pmapkwargs.items())
    )
    return _Pmapped(
        as_pytree_function(fun), in_axes, out_axes, axis_name, axis_size, donate,
        _Cache(), options, parameter_names(fun, in_axes),
    )  # fmt: skip


def _check_donate(donate: str) -> None:
    if donate not in ("none", "all", "warn"):
        raise ValueError(
            "`filter_pmap(donate=...)` must be 'none', 'all' or 'warn'; got "
            f"{donate!r}."
        )
