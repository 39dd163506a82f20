"""`filter_vmap` and `if_array`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

from .._filters import is_array
from .._module import as_pytree_function, field
from ._split import OutBox, describe, keystr
from ._wrapped import Wrapped


@dataclasses.dataclass(frozen=True)
class if_array:
    """An axis spec for [`boxwood.filter_vmap`][]: `axis` for arrays, `None` (broadcast)
    for everything else.

    >>> import boxwood, jax.numpy as jnp
    >>> spec = boxwood.if_array(1)
    >>> spec(jnp.zeros((2, 3))), spec("relu")
    (1, None)
    """

    axis: int

    def __call__(self, x: Any) -> int | None:
        return self.axis if is_array(x) else None


UNMAPPED = object()  # stands in for a `None` axis (a `None` leaf would vanish)


def _is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float, complex))


def _resolve_leaf(spec: Any, leaf: Any, where: str, what: str) -> Any:
    axis = spec(leaf) if callable(spec) else spec
    if axis is None:
        return UNMAPPED
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(
            f"`{what}` gave {axis!r} for {where}; axes must be ints or None (or "
            "callables returning those, such as `boxwood.if_array(0)`)."
        )
    if not is_array(leaf) and not (what == "out_axes" and _is_number(leaf)):
        # an output number with an axis is broadcast to an array (as in Equinox)
        raise ValueError(
            f"`{what}` says to vectorise {where} along axis {axis}, but it is "
            f"{describe(leaf)}, not an array. Only arrays can be vectorised: use "
            f"None for it (or `boxwood.if_array({axis})`, which broadcasts non-arrays)."
        )
    return axis


def resolve_axes(axes: Any, tree: Any, what: str, root: str) -> list:
    """Per-leaf axes of `tree` (ints, or `UNMAPPED`), from the prefix `axes`."""

    def expand(prefix_path, spec, subtree):
        if not (spec is None or isinstance(spec, int) or callable(spec)):
            raise ValueError(
                f"`{what}` must be a pytree of ints, None and callables, but has "
                f"{type(spec).__name__} {spec!r} at {root}{keystr(prefix_path)}."
            )
        return jax.tree_util.tree_map_with_path(
            lambda p, leaf: _resolve_leaf(
                spec, leaf, f"{root}{keystr(prefix_path + p)}", what
            ),
            subtree,
        )

    prefix = jax.tree_util.tree_structure(axes, is_leaf=lambda x: x is None)
    try:
        prefix.flatten_up_to(tree)
    except ValueError:
        structure = jax.tree_util.tree_structure(tree)
        raise ValueError(
            f"`{what}` must be a pytree prefix of {root} (structure {structure}); "
            f"got {what}={axes!r}."
        ) from None
    full = jax.tree_util.tree_map_with_path(
        expand, axes, tree, is_leaf=lambda x: x is None
    )
    return jax.tree_util.tree_leaves(full, is_leaf=lambda x: x is UNMAPPED)


def named_axes(param_names: tuple[str, ...] | None, in_axes: dict, nargs: int) -> tuple:
    params = list(param_names or ())[:nargs]
    unknown = sorted(set(in_axes) - set(params))
    if unknown:
        raise ValueError(
            f"`in_axes` names {unknown}, which are not among the positional arguments "
            f"passed to the vectorised function ({params})."
        )
    return tuple(in_axes.get(name, if_array(0)) for name in params)


def parameter_names(fun: Callable, in_axes: Any) -> tuple[str, ...] | None:
    if not isinstance(in_axes, dict):
        return None
    try:
        return tuple(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        raise TypeError(
            f"`filter_vmap(in_axes=dict(...))` needs the signature of {fun!r} to match "
            "names to arguments, but it has none. Give `in_axes` as a tuple instead."
        ) from None


def _output_leaves(
    out_axes: list, traced: list, batched: list, unbatched: list
) -> list:
    """The output's leaves: batched arrays moved to their `out_axes`, unbatched
    arrays, and non-arrays as traced (the same for every example)."""
    batched_it, unbatched_it = iter(batched), iter(unbatched)
    leaves = []
    for a, x in zip(out_axes, traced):
        if a is not UNMAPPED:
            y = next(batched_it)
            leaves.append(y if a == 0 else jnp.moveaxis(y, 0, a))
        else:
            leaves.append(next(unbatched_it) if is_array(x) else x)
    return leaves


class _Vmapped(Wrapped):
    in_axes: Any
    out_axes: Any
    axis_name: Hashable | None = field(static=True)
    axis_size: int | None = field(static=True)
    param_names: tuple[str, ...] | None = field(static=True)
    vmapkwargs: tuple = field(static=True, default=())  # sorted (name, value) pairs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(
                "Functions vectorised with `filter_vmap` take positional arguments "
                f"only; got keyword arguments {sorted(kwargs)}. Pass them by position "
                "(use `in_axes=dict(name=axis)` to choose axes by argument name)."
            )
        axes = resolve_axes(self._in_axes_for(args), args, "in_axes", "args")
        leaves, treedef = jax.tree_util.tree_flatten(args)
        mapped = [i for i, a in enumerate(axes) if a is not UNMAPPED]
        # Nothing vectorised, no size: `fun` is simply called (as in Equinox), which
        # works while `out_axes` gives every output None.
        sizeless = not mapped and self.axis_size is None
        box = OutBox()

        def per_example(mapped_leaves):
            new_leaves = list(leaves)
            for i, x in zip(mapped, mapped_leaves):
                new_leaves[i] = x
            out = self.fun(*jax.tree_util.tree_unflatten(treedef, new_leaves))
            out_axes = resolve_axes(self.out_axes, out, "out_axes", "the output")
            if sizeless and any(a is not UNMAPPED for a in out_axes):
                raise ValueError(
                    "`filter_vmap`: no argument is vectorised (every `in_axes` leaf "
                    "resolved to None), so the batch size of the outputs `out_axes` "
                    "gives an axis is unknown. Pass `axis_size=`, or `out_axes=None` "
                    "for outputs that do not depend on a batch."
                )
            out_leaves, out_def = jax.tree_util.tree_flatten(out)
            box.put((out_def, out_axes, out_leaves))
            batched = [
                jnp.asarray(x) if _is_number(x) else x
                for x, a in zip(out_leaves, out_axes)
                if a is not UNMAPPED
            ]
            unbatched = [
                x for x, a in zip(out_leaves, out_axes) if a is UNMAPPED and is_array(x)
            ]
            return batched, unbatched

        vectorised = per_example if sizeless else jax.vmap(
            per_example,
            in_axes=([axes[i] for i in mapped],),
            out_axes=(0, None),
            axis_name=self.axis_name,
            axis_size=self.axis_size,
            **dict(self.vmapkwargs),
        )  # fmt: skip
        batched, unbatched = vectorised([leaves[i] for i in mapped])
        out_def, out_axes, traced_leaves = box.get()
        out_leaves = _output_leaves(out_axes, traced_leaves, batched, unbatched)
        return jax.tree_util.tree_unflatten(out_def, out_leaves)

    def _in_axes_for(self, args: tuple) -> Any:
        in_axes = self.in_axes
        if isinstance(in_axes, dict):
            return named_axes(self.param_names, in_axes, len(args))
        if isinstance(in_axes, list):
            return tuple(in_axes)
        return in_axes


def filter_vmap(
    fun: Callable | None = None,
    *,
    in_axes: Any = if_array(0),
    out_axes: Any = if_array(0),
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    **vmapkwargs: Any,
) -> Callable:
    """Vectorise a function over arrays, broadcasting everything else.

    By default every array (JAX or NumPy) in the arguments is vectorised down its
    leading axis and every other leaf (Python numbers, strings, functions, ...) is
    broadcast. Usable as `@filter_vmap` or `@filter_vmap(in_axes=...)`.

    **Arguments:**

    - `fun`: the function to vectorise, called as `fun(*args)` (no keyword
      arguments).
    - `in_axes`: a pytree whose leaves are ints (vectorise that axis), `None`
      (broadcast) or callables `leaf -> int | None` applied to every leaf below them
      (e.g. `boxwood.if_array(0)`). Either a pytree prefix of the tuple of positional
      arguments, or a dict mapping argument names to such pytrees (unnamed arguments
      get `if_array(0)`).
    - `out_axes`: the same kind of pytree, a prefix of the output: where the batch
      axis goes in each output array. Non-array outputs given `None` are returned
      as they are, as are arrays given `None` (which must not depend on the
      vectorised inputs); a Python number given an axis is broadcast to an array
      along it (as in Equinox); other non-arrays must resolve to `None`.
    - `axis_name`: a name for the vectorised axis, for collectives (`jax.lax.psum`).
    - `axis_size`: the batch size; needed only when nothing is vectorised and an
      output is given an axis (else `fun` is simply called, as in Equinox).
    - `**vmapkwargs`: other options of `jax.vmap` (`spmd_axis_name`).

    **Returns:**

    The vectorised function.

    Creating an ensemble: the arrays of modules built inside `fun` come out stacked,
    as one module.

    >>> import boxwood, jax, jax.numpy as jnp
    >>> class Scale(boxwood.Module):
    ...     w: jax.Array
    ...     def __call__(self, x):
    ...         return self.w * x
    >>> ensemble = boxwood.filter_vmap(lambda w: Scale(w))(jnp.arange(3.0))
    >>> boxwood.filter_vmap(lambda m, x: m(x), in_axes=(0, None))(ensemble, 2.0)
    Array([0., 2., 4.], dtype=float32)
    """
    options = _hashable_options(vmapkwargs)
    if fun is None:
        return functools.partial(
            filter_vmap, in_axes=in_axes, out_axes=out_axes, axis_name=axis_name,
            axis_size=axis_size, **vmapkwargs,
        )  # fmt: skip
    return _Vmapped(
        as_pytree_function(fun), in_axes, out_axes, axis_name, axis_size,
        parameter_names(fun, in_axes), options,
    )  # fmt: skip


def _hashable_options(vmapkwargs: dict) -> tuple:
    """The options for `jax.vmap` as sorted `(name, value)` pairs, checked to be
    hashable (they sit in a static field)."""
    try:
        options = tuple(sorted(vmapkwargs.items()))
        hash(options)
    except TypeError:
        raise TypeError(
            "`filter_vmap`: the options passed on to `jax.vmap` must be hashable; "
            f"got {vmapkwargs!r}."
        ) from None
    return options
