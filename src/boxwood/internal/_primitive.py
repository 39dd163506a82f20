"""Primitives over pytrees: `filter_primitive_def`, `filter_primitive_jvp`,
`filter_primitive_transpose`, `filter_primitive_batching`, `filter_primitive_bind`,
and `materialise_zeros`.

A primitive bound with `filter_primitive_bind(prim, *args)` receives the array
leaves of `args` as its operands; everything else rides along as parameters:

- `treedef`: the structure of `args`,
- `static`: one entry per leaf of `args`, the leaf itself where it is not an array
  and `_DYNAMIC` where it is one of the operands,
- `flatten`: an `OutputRecord`, which the first rule to produce an output (the
  abstract evaluation under tracing, the implementation otherwise) fills with the
  output's structure and its non-array leaves, so that `filter_primitive_bind` can
  rebuild the pytree the rules returned.

The wrappers below turn rules written on pytrees into rules on those flat operands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad

from .._filters import is_array, is_array_like

# Stands in the `static` parameter for a leaf passed as an operand.
_DYNAMIC = object()


def _is_operand(x: Any) -> bool:
    """Array leaves, and what stands for them inside rules (avals, undefined
    primals); `ad.UndefinedPrimal` only when not wrapped."""
    return is_array(x) or isinstance(x, (ShapedArray, _Undefined))


class _Undefined:
    """Wraps an `ad.UndefinedPrimal` (which is itself a pytree node with no
    leaves) so that it stays a single leaf while the inputs are rebuilt."""

    __slots__ = ("primal",)

    def __init__(self, primal: Any) -> None:
        self.primal = primal


def _rebuild(treedef: Any, static: tuple, operands: Any) -> Any:
    """The pytree `filter_primitive_bind` was called with, its operands replaced by
    `operands` (in order)."""
    it = iter(operands)
    leaves = [next(it) if s is _DYNAMIC else s for s in static]
    if next(it, _DYNAMIC) is not _DYNAMIC:
        raise ValueError("Internal error: more operands than array leaves.")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _symbolic_zero(primal: Any) -> ad.Zero:
    aval = jax.typeof(primal) if not isinstance(primal, ShapedArray) else primal
    return ad.Zero(aval.to_tangent_aval())


def _is_none(x: Any) -> bool:
    return x is None


class OutputRecord:
    """Remembers the structure of a primitive's output (see the module docstring).
    Compared by identity, so that it can be a primitive's parameter."""

    __slots__ = ("treedef", "static", "__weakref__")

    def filled(self) -> bool:
        return hasattr(self, "treedef")

    def get(self) -> tuple:
        return self.treedef, self.static

    def _record(self, treedef: Any, static: tuple) -> None:
        if not self.filled():
            self.treedef, self.static = treedef, static
        elif self.treedef != treedef:
            raise ValueError(
                "A filter primitive's rules returned outputs of different "
                f"structures: {self.treedef} and {treedef}."
            )

    def __call__(self, out: Any) -> list:
        """The operand leaves of `out`, recording the rest."""
        leaves, treedef = jax.tree_util.tree_flatten(out)
        static = tuple(_DYNAMIC if _is_operand(x) else x for x in leaves)
        self._record(treedef, static)
        return [x for x in leaves if _is_operand(x)]

    def paired(self, out: Any, like: Any) -> tuple:
        """The operand leaves of `out`, and the matching leaves of `like` (a tree
        shaped as `out`, `None` for no value), recording `out`'s structure. A leaf of
        `out` is an operand where it is an array, or where `like` has a value."""
        out_nodes, like_nodes = _align(out, like)
        leaves, treedef = jax.tree_util.tree_flatten(out)
        if len(leaves) != len(out_nodes):
            raise ValueError("Internal error: `None` inside a primitive's output.")
        dynamic = [
            _is_operand(x) or y is not None for x, y in zip(out_nodes, like_nodes)
        ]
        static = tuple(_DYNAMIC if d else x for d, x in zip(dynamic, out_nodes))
        self._record(treedef, static)
        flat_out = [x for d, x in zip(dynamic, out_nodes) if d]
        flat_like = [y for d, y in zip(dynamic, like_nodes) if d]
        return flat_out, flat_like


def _align(out: Any, like: Any) -> tuple:
    """Leaves of `out`, and for each the leaf of `like` at the same place (`like`
    may have `None` in place of whole subtrees of `out`)."""
    out_nodes: list = []
    like_nodes: list = []

    def visit(o: Any, y: Any) -> None:
        leaves = jax.tree_util.tree_leaves(o)
        out_nodes.extend(leaves)
        if y is None:
            like_nodes.extend([None] * len(leaves))
        else:
            ys = jax.tree_util.tree_leaves(y, is_leaf=_is_none)
            if len(ys) != len(leaves):
                raise ValueError(
                    "A filter primitive rule returned tangents, cotangents or batch "
                    "axes whose structure does not match its outputs."
                )
            like_nodes.extend(ys)

    jax.tree_util.tree_map(visit, out, like, is_leaf=_is_none)
    return out_nodes, like_nodes


def filter_primitive_def(rule: Callable) -> Callable:
    """Wrap `rule(*args) -> out`, written on pytrees, as a primitive's
    implementation or abstract evaluation (`prim.def_impl(...)`,
    `prim.def_abstract_eval(...)`).

    Under abstract evaluation the array leaves of `args` arrive as
    `jax.core.ShapedArray`s, and the rule must return `ShapedArray`s for the array
    leaves of its output. Call the primitive with
    [`boxwood.internal.filter_primitive_bind`][].
    """

    def flat_rule(*operands: Any, treedef: Any, static: tuple, flatten: Any) -> list:
        return flatten(rule(*_rebuild(treedef, static, operands)))

    flat_rule.__wrapped__ = rule  # type: ignore[attr-defined]
    return flat_rule


def filter_primitive_jvp(rule: Callable) -> Callable:
    """Wrap `rule(primals, tangents) -> (primals_out, tangents_out)` as a
    primitive's JVP rule (`jax.interpreters.ad.primitive_jvps[prim] = ...`).

    `primals` is the tuple of arguments given to `filter_primitive_bind`;
    `tangents` has the same structure, with `None` for a symbolic zero tangent
    (always so for non-array leaves). The rule returns the outputs and their
    tangents, again with `None` for zero tangents and for non-array outputs.
    """

    def flat_rule(
        primals: Any, tangents: Any, *, treedef: Any, static: tuple, flatten: Any
    ) -> tuple:
        tangents = [None if type(t) is ad.Zero else t for t in tangents]
        no_tangent = tuple(s if s is _DYNAMIC else None for s in static)
        primals_in = _rebuild(treedef, static, primals)
        tangents_in = _rebuild_with_none(treedef, no_tangent, tangents)
        out, t_out = rule(primals_in, tangents_in)
        flat_out, flat_t = flatten.paired(out, t_out)
        flat_t = [
            _symbolic_zero(p) if t is None else t for p, t in zip(flat_out, flat_t)
        ]
        return flat_out, flat_t

    return flat_rule


def _rebuild_with_none(treedef: Any, static: tuple, operands: list) -> Any:
    # `None` is not a leaf, so the tree is rebuilt with a placeholder then cleared.
    placeholder = object()
    ops = [placeholder if x is None else x for x in operands]
    leaves = [placeholder if s is None else s for s in static]
    tree = _rebuild(treedef, tuple(leaves), ops)
    return jax.tree_util.tree_map(lambda x: None if x is placeholder else x, tree)


_NO_RULE: Any = object()


def filter_primitive_transpose(
    rule: Callable = _NO_RULE, *, materialise_zeros: bool = False
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
    if rule is _NO_RULE:
        return lambda r: filter_primitive_transpose(
            r, materialise_zeros=materialise_zeros
        )

    def flat_rule(
        cts: Any, *operands: Any, treedef: Any, static: tuple, flatten: Any
    ) -> list:
        out_treedef, out_static = flatten.get()
        if materialise_zeros:
            cts = [ad.instantiate_zeros(c) for c in cts]
        else:
            cts = [None if type(c) is ad.Zero else c for c in cts]
        cts_out = _rebuild_with_none(out_treedef, out_static, cts)
        wrapped = [
            _Undefined(x) if isinstance(x, ad.UndefinedPrimal) else x for x in operands
        ]
        inputs = _rebuild(treedef, static, wrapped)
        plain = jax.tree_util.tree_map(
            lambda x: x.primal if isinstance(x, _Undefined) else x, inputs
        )
        cts_in = rule(plain, cts_out)
        flat_in, flat_ct = OutputRecord().paired(inputs, cts_in)
        if len(flat_ct) != len(operands):
            raise ValueError(
                "A filter primitive's transpose rule returned cotangents for "
                "non-array inputs."
            )
        return [
            _symbolic_zero(x.primal.aval if isinstance(x, _Undefined) else x)
            if c is None
            else c
            for x, c in zip(flat_in, flat_ct)
        ]

    return flat_rule


def filter_primitive_batching(rule: Callable) -> Callable:
    """Wrap `rule(inputs, batch_axes) -> (out, out_axes)` as a primitive's batching
    rule (`jax.interpreters.batching.primitive_batchers[prim] = ...`).

    `batch_axes` is shaped as `inputs` (the arguments given to
    `filter_primitive_bind`), an int for each batched array and `None` elsewhere.
    The rule returns the batched outputs and their batch axes (`None` for
    unbatched outputs and non-array leaves).
    """

    def flat_rule(
        operands: Any, axes: Any, *, treedef: Any, static: tuple, flatten: Any
    ) -> tuple:
        inputs = _rebuild(treedef, static, operands)
        no_axis = tuple(s if s is _DYNAMIC else None for s in static)
        axes_in = _rebuild_with_none(treedef, no_axis, list(axes))
        out, out_axes = rule(inputs, axes_in)
        return flatten.paired(out, out_axes)

    return flat_rule


def filter_primitive_bind(prim: Any, *args: Any) -> Any:
    """Call `prim` (with `multiple_results = True`, its rules wrapped by the
    functions above) on the pytrees `args`; returns the pytree its rules return."""
    if not prim.multiple_results:
        raise ValueError(
            f"`filter_primitive_bind`: primitive {prim} must have "
            "`multiple_results = True`."
        )
    leaves, treedef = jax.tree_util.tree_flatten(args)
    operands = [x for x in leaves if is_array(x)]
    static = tuple(_DYNAMIC if is_array(x) else x for x in leaves)
    record = OutputRecord()
    flat_out = prim.bind(*operands, treedef=treedef, static=static, flatten=record)
    out_treedef, out_static = record.get()
    return _rebuild(out_treedef, out_static, flat_out)


def materialise_zeros(primal: Any, tangent: Any, allow_struct: bool = False) -> Any:
    """`tangent`, or where it is `None` (a symbolic zero) and `primal` is array-like
    (or, with `allow_struct`, a `jax.ShapeDtypeStruct`), an array of zeros with
    `primal`'s tangent shape and dtype."""
    array_like = is_array_like(primal) or (
        allow_struct and isinstance(primal, jax.ShapeDtypeStruct)
    )
    if tangent is not None or not array_like:
        return tangent
    if isinstance(primal, jax.ShapeDtypeStruct):
        aval = ShapedArray(primal.shape, primal.dtype)
    else:
        aval = jax.typeof(jnp.asarray(primal))
    return ad.instantiate_zeros(ad.Zero(aval.to_tangent_aval()))
