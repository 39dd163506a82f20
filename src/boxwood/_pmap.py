"""`filter_pmap`: `jax.pmap` over the arrays of arbitrary pytrees."""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

from ._filters import is_array
from ._jit._bound import as_pytree_function
from ._module import field
from ._partition import OutBox, Wrapped
from ._vmap import _UNMAPPED, _resolve, if_array

_EACH_ARRAY = if_array(0)  # the default axes: every array on its leading axis
_CACHE_SIZE = 32  # compiled programs kept per wrapper (least recently used dropped)


class _Cache:
    """Compiled programs of one wrapper, most recently used last (hashed by id, so
    it can sit in a static field)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: collections.OrderedDict = collections.OrderedDict()


class _Axis(int):
    """An output's mapped axis (tells it apart from a non-array output `0`)."""


def _place(x: Any, axis: int) -> Any:
    return x if axis == 0 else jnp.moveaxis(x, 0, axis)


class _Pmapped(Wrapped):
    in_axes: Any
    out_axes: Any
    axis_name: Hashable | None = field(static=True)
    axis_size: int | None = field(static=True)
    donate: str = field(static=True)
    cache: _Cache = field(static=True)
    pmapkwargs: tuple = field(static=True, default=())  # sorted (name, value) pairs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(
                "Functions parallelised with `filter_pmap` take positional arguments "
                f"only; got keyword arguments {sorted(kwargs)}. Pass them by position."
            )
        axes = _resolve(self.in_axes, args, "in_axes", "args")
        leaves, treedef = jax.tree_util.tree_flatten(args)
        # Every array is an argument of the pmapped function (unmapped ones with
        # axis None: broadcast to every device); the rest is compiled in.
        mapped = tuple(i for i, x in enumerate(leaves) if is_array(x))
        static = tuple(x for x in leaves if not is_array(x))
        dev_axes = tuple(None if axes[i] is _UNMAPPED else axes[i] for i in mapped)
        key = (treedef, mapped, dev_axes, static)
        cache = self.cache.entries
        try:
            entry = cache.pop(key)
        except TypeError:
            raise TypeError(
                "`filter_pmap`: every non-array argument must be hashable (they are "
                "compiled into the program)."
            ) from None
        except KeyError:
            entry = self._compile(leaves, treedef, mapped, list(dev_axes))
        cache[key] = entry
        while len(cache) > _CACHE_SIZE:
            cache.pop(next(iter(cache)))
        pmapped, box = entry
        with warnings.catch_warnings():
            if self.donate == "all":  # as Equinox: "all" silences unusable donations
                warnings.filterwarnings("ignore", "Some donated buffers")
            arrays = iter(pmapped([leaves[i] for i in mapped]))
        out_def, out_kinds = box.get()
        out = [
            _place(next(arrays), k) if isinstance(k, _Axis) else k for k in out_kinds
        ]
        return jax.tree_util.tree_unflatten(out_def, out)

    def _compile(self, leaves: list, treedef: Any, mapped: tuple, axes: list) -> tuple:
        box = OutBox()
        template = [None if i in mapped else x for i, x in enumerate(leaves)]

        def per_device(mapped_leaves: list) -> list:
            new = list(template)
            for i, x in zip(mapped, mapped_leaves):
                new[i] = x
            out = self.fun(*jax.tree_util.tree_unflatten(treedef, new))
            out_axes = _resolve(self.out_axes, out, "out_axes", "the output")
            out_leaves, out_def = jax.tree_util.tree_flatten(out)
            pairs = list(zip(out_leaves, out_axes))
            if any(a is _UNMAPPED and is_array(x) for x, a in pairs):
                raise ValueError(
                    "`filter_pmap` cannot return an array unmapped (`out_axes` None); "
                    "give every output array an integer axis."
                )
            box.put((out_def, [x if a is _UNMAPPED else _Axis(a) for x, a in pairs]))
            return [x for x, a in pairs if a is not _UNMAPPED]

        # Mapped outputs come out on axis 0 and are moved after (out_axes are only
        # known once `fun` is traced).
        runner = jax.pmap(
            per_device,
            in_axes=(axes,),
            axis_name=self.axis_name,
            axis_size=self.axis_size,
            donate_argnums=(0,) if self.donate in ("all", "warn") else (),
            **dict(self.pmapkwargs),
        )
        return runner, box


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
    - `in_axes`, `out_axes`: as for [`boxwood.filter_vmap`][]; each output array
      must be mapped (an int axis).
    - `axis_name`: the name of the device axis, for collectives (`jax.lax.psum`).
    - `axis_size`: the number of devices; needed only when no input is mapped.
    - `donate`: `"none"`; `"all"` (donate the input arrays' buffers, silencing
      JAX's warning about buffers it could not reuse); or `"warn"` (donate, and let
      that warning through).
    - `**pmapkwargs`: other options of `jax.pmap` (`devices`, `backend`, ...).

    **Returns:**

    The parallelised function. Each distinct set of non-array arguments and
    argument shapes is compiled once; the 32 most recently used are kept.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> f = boxwood.filter_pmap(lambda x, k: x * k)
    >>> f(jnp.ones((jax.local_device_count(), 2)), 3).shape[1]
    2
    """
    if donate not in ("none", "all", "warn"):
        raise ValueError(
            "`filter_pmap(donate=...)` must be 'none', 'all' or 'warn'; got "
            f"{donate!r}."
        )
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
        _Cache(), options,
    )  # fmt: skip
