"""Primitives over pytrees: `filter_primitive_def`, `filter_primitive_jvp`,
`filter_primitive_transpose`, `filter_primitive_batching`, `filter_primitive_bind`,
and `materialise_zeros`.

`filter_primitive_bind(prim, *args)` splits `args` with `boxwood.partition` into
the tree of its arrays and the tree of everything else. The arrays become the
primitive's operands; the rest travels as the parameter `layout`, a `_Layout`
that can put operands (or their tangents, cotangents, batch axes) back in place.
The parameter `out` is an `_OutputSlot`: the first rule to produce an output (the
abstract evaluation under tracing, the implementation otherwise) stores the
output's `_Layout` there, so that `filter_primitive_bind` and the transpose rule
can rebuild the pytree the rules return.

The wrappers below turn rules written on pytrees into rules on those operands.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.core import ShapedArray
from jax.interpreters import ad

from .._filters import combine, is_array, is_array_like, partition

_tu = jax.tree_util


def _is_undefined(x: Any) -> bool:
    return isinstance(x, ad.UndefinedPrimal)


def _is_none(x: Any) -> bool:
    return x is None


def _is_operand(x: Any) -> bool:
    """Arrays, and the abstract values that stand for them in abstract evaluation."""
    return is_array(x) or isinstance(x, ShapedArray)


class _Layout:
    """A pytree taken apart: `arrays` is the structure of its tree of operands
    (`None` at every other leaf), `paths` the key path of each operand, and `rest`
    the tree of everything else (`None` at each operand). Hashed by identity, so
    that it can be a primitive's parameter whatever `rest` holds."""

    __slots__ = ("arrays", "paths", "rest")

    def __init__(self, arrays: Any, paths: list, rest: Any) -> None:
        self.arrays, self.paths, self.rest = arrays, paths, rest

    def __repr__(self) -> str:
        return f"_Layout({len(self.paths)} operands)"

    def scatter(self, values: Any) -> Any:
        """The tree of operands, `values` (one per operand) in their places and
        `None` at every other leaf."""
        return _tu.tree_unflatten(self.arrays, list(values))

    def assemble(self, values: Any) -> Any:
        """The whole tree again, with `values` in place of its operands."""
        return combine(self.scatter(values), self.rest, is_leaf=_is_undefined)

    def same_shape(self, other: _Layout) -> bool:
        return self.arrays == other.arrays and _tu.tree_structure(
            self.rest, is_leaf=_is_none
        ) == _tu.tree_structure(other.rest, is_leaf=_is_none)


def _take_apart(tree: Any, operand: Any = _is_operand) -> tuple[list, _Layout]:
    """The operands of `tree` (the leaves `operand` selects, as `boxwood.partition`
    reads a filter), and the `_Layout` that puts them back."""
    arrays, rest = partition(tree, operand)
    with_paths, structure = _tu.tree_flatten_with_path(arrays)
    paths = [path for path, _ in with_paths]
    return [leaf for _, leaf in with_paths], _Layout(structure, paths, rest)


class _OutputSlot:
    """Holds the `_Layout` of a primitive's output once a rule has produced one.
    Hashed by identity, so that it can be a primitive's parameter."""

    __slots__ = ("layout", "__weakref__")

    def __init__(self) -> None:
        self.layout: _Layout | None = None

    def __repr__(self) -> str:
        return f"_OutputSlot({self.layout!r})"

    def store(self, out: Any, operand: Any = _is_operand) -> tuple[list, _Layout]:
        """Take `out` apart, keeping its layout (or checking it against the one a
        previous rule produced)."""
        operands, layout = _take_apart(out, operand)
        if self.layout is None:
            self.layout = layout
        elif not self.layout.same_shape(layout):
            raise ValueError(
                "The rules of a filter primitive returned outputs of different "
                f"structures: {self.layout.arrays} and {layout.arrays}. Every rule "
                "must return the same pytree, with arrays in the same places."
            )
        return operands, layout

    def filled(self) -> _Layout:
        if self.layout is None:
            raise ValueError(
                "Internal error: a filter primitive was transposed or bound before "
                "any of its rules produced an output."
            )
        return self.layout


def _entries_at(paths: list, companion: Any, what: str) -> list:
    """The entry of `companion` at each of `paths` (key paths into the tree that
    `companion` mirrors, except that a `None` in `companion` may stand for a whole
    subtree: no entry for any leaf below it). An entry that is not `None` at any
    other place is an error."""
    found = dict(_tu.tree_flatten_with_path(companion, is_leaf=_is_none)[0])
    wanted = set(paths)
    for path, entry in found.items():
        if entry is not None and path not in wanted:
            raise ValueError(
                f"A filter primitive rule returned {what} at `{_tu.keystr(path)}`, "
                "which holds no array. Use `None` there."
            )
    return [_lookup(found, path, what) for path in paths]


def _operands_with(tree: Any, companion: Any, what: str) -> tuple[Any, list]:
    """Which leaves of the output `tree` are operands (its arrays, and any leaf
    `companion` gives an entry for, such as a Python float with a tangent), as a
    tree of bools; and the entry of `companion` for each operand."""
    with_paths, structure = _tu.tree_flatten_with_path(tree)
    entries = _entries_at([path for path, _ in with_paths], companion, what)
    chosen = [
        _is_operand(leaf) or entry is not None
        for (_, leaf), entry in zip(with_paths, entries)
    ]
    picked = [entry for entry, keep in zip(entries, chosen) if keep]
    return _tu.tree_unflatten(structure, chosen), picked


def _lookup(found: dict, path: tuple, what: str) -> Any:
    for cut in range(len(path), -1, -1):
        if path[:cut] in found:
            entry = found[path[:cut]]
            if cut < len(path) and entry is not None:
                break
            return entry
    raise ValueError(
        f"A filter primitive rule returned {what} whose structure does not match "
        f"its arrays: nothing found for `{_tu.keystr(path)}`."
    )


def _none_if_zero(x: Any) -> Any:
    return None if isinstance(x, ad.Zero) else x


def _zero_like(x: Any) -> ad.Zero:
    aval = x.aval if _is_undefined(x) else jax.typeof(x)
    return ad.Zero(aval.to_tangent_aval())


def filter_primitive_def(rule: Callable) -> Callable:
    """Wrap `rule(*args) -> out`, written on pytrees, as a primitive's
    implementation or abstract evaluation (`prim.def_impl(...)`,
    `prim.def_abstract_eval(...)`).

    Under abstract evaluation the array leaves of `args` arrive as
    `jax.core.ShapedArray`s, and the rule must return `ShapedArray`s for the array
    leaves of its output. Call the primitive with
    [`boxwood.internal.filter_primitive_bind`][].
    """

    @functools.wraps(rule)
    def on_operands(*operands: Any, layout: _Layout, out: _OutputSlot) -> list:
        return out.store(rule(*layout.assemble(operands)))[0]

    return on_operands


def filter_primitive_jvp(rule: Callable) -> Callable:
    """Wrap `rule(primals, tangents) -> (primals_out, tangents_out)` as a
    primitive's JVP rule (`jax.interpreters.ad.primitive_jvps[prim] = ...`).

    `primals` is the tuple of arguments given to `filter_primitive_bind`;
    `tangents` has the same structure, with `None` for a symbolic zero tangent
    (always so for non-array leaves). The rule returns the outputs and their
    tangents, again with `None` for zero tangents and for non-array outputs.
    """

    @functools.wraps(rule)
    def on_operands(
        primals: Any, tangents: Any, *, layout: _Layout, out: _OutputSlot
    ) -> tuple:
        tree_tangents = layout.scatter(map(_none_if_zero, tangents))
        primals_out, tangents_out = rule(layout.assemble(primals), tree_tangents)
        chosen, flat_t = _operands_with(primals_out, tangents_out, "a tangent")
        flat_out, _ = out.store(primals_out, chosen)
        flat_t = [_zero_like(p) if t is None else t for p, t in zip(flat_out, flat_t)]
        return flat_out, flat_t

    return on_operands


def filter_primitive_transpose(
    rule: Callable | None = None, *, materialise_zeros: bool = False
) -> Callable:
    """Wrap `rule(inputs, cts_out) -> cts_in` as a primitive's transpose rule
    (`jax.interpreters.ad.primitive_transposes[prim] = ...`). Usable as
    `@filter_primitive_transpose` or `@filter_primitive_transpose(materialise_zeros=True)`.

    `inputs` is the tuple of arguments given to `filter_primitive_bind`, with
    `jax.interpreters.ad.UndefinedPrimal`s for the linear inputs. `cts_out` is
    shaped as the primitive's output, with `None` for a symbolic zero cotangent
    (or, with `materialise_zeros=True`, arrays of zeros instead). The rule returns a
    tree shaped as `inputs`, with `None` wherever there is no cotangent.
    """
    if rule is None:
        return functools.partial(
            filter_primitive_transpose, materialise_zeros=materialise_zeros
        )
    read_ct = ad.instantiate_zeros if materialise_zeros else _none_if_zero

    @functools.wraps(rule)
    def on_operands(cts: Any, *operands: Any, layout: _Layout, out: _OutputSlot):
        cts_out = out.filled().assemble(map(read_ct, cts))
        cts_in = rule(layout.assemble(operands), cts_out)
        flat_ct = _entries_at(layout.paths, cts_in, "a cotangent")
        return [_cotangent_for(x, ct) for x, ct in zip(operands, flat_ct)]

    return on_operands


def _cotangent_for(operand: Any, ct: Any) -> Any:
    # JAX reads a cotangent only for the linear operands (the undefined ones).
    if not _is_undefined(operand):
        return None
    return _zero_like(operand) if ct is None else ct


def filter_primitive_batching(rule: Callable) -> Callable:
    """Wrap `rule(inputs, batch_axes) -> (out, out_axes)` as a primitive's batching
    rule (`jax.interpreters.batching.primitive_batchers[prim] = ...`).

    `batch_axes` is shaped as `inputs` (the arguments given to
    `filter_primitive_bind`), an int for each batched array and `None` elsewhere.
    The rule returns the batched outputs and their batch axes (`None` for
    unbatched outputs and non-array leaves).
    """

    @functools.wraps(rule)
    def on_operands(
        operands: Any, axes: Any, *, layout: _Layout, out: _OutputSlot
    ) -> tuple:
        result, result_axes = rule(layout.assemble(operands), layout.scatter(axes))
        chosen, flat_axes = _operands_with(result, result_axes, "a batch axis")
        flat_out, _ = out.store(result, chosen)
        return flat_out, flat_axes

    return on_operands


def filter_primitive_bind(prim: Any, *args: Any) -> Any:
    """Call `prim` (with `multiple_results = True`, its rules wrapped by the
    functions above) on the pytrees `args`; returns the pytree its rules return."""
    if not prim.multiple_results:
        raise ValueError(
            f"`filter_primitive_bind`: primitive {prim} must have "
            "`multiple_results = True` (set it before registering its rules)."
        )
    operands, layout = _take_apart(args)
    slot = _OutputSlot()
    results = prim.bind(*operands, layout=layout, out=slot)
    return slot.filled().assemble(results)


def materialise_zeros(primal: Any, tangent: Any, allow_struct: bool = False) -> Any:
    """`tangent`, or where it is `None` (a symbolic zero) and `primal` is array-like
    (or, with `allow_struct`, a `jax.ShapeDtypeStruct`), an array of zeros with
    `primal`'s tangent shape and dtype."""
    if tangent is not None:
        return tangent
    if isinstance(primal, jax.ShapeDtypeStruct):
        if not allow_struct:
            return None
        aval = ShapedArray(primal.shape, primal.dtype)
    elif is_array_like(primal):
        aval = jax.typeof(primal)
    else:
        return None
    return ad.instantiate_zeros(ad.Zero(aval.to_tangent_aval()))
