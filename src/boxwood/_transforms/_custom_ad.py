"""`filter_custom_jvp` and `filter_custom_vjp`: custom derivatives for functions of
arbitrary pytrees.

Each call builds a fresh `jax.custom_jvp` / `jax.custom_vjp` over the arrays of the
arguments; the non-array leaves are closed over, and the non-array leaves of the
output come back through an `OutBox`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from .._filters import combine, is_array, is_inexact_array, partition
from .._tracebacks import hiding_own_frames
from ._split import OutBox, Slots, keystr, split_out


def _is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero) or getattr(t, "dtype", None) == jax.dtypes.float0


def _zero_like(x: Any) -> SymbolicZero:
    return SymbolicZero(jax.typeof(x).to_tangent_aval())


def _out_tangents(out_dynamic: Any, t_out: Any, name: str) -> Any:
    """Tangents for the arrays of the output: `t_out` has the output's structure,
    with `None` (a zero tangent) allowed at any leaf."""
    leaves, treedef = jax.tree_util.tree_flatten(out_dynamic)
    try:
        t_leaves = treedef.flatten_up_to(t_out)
    except ValueError:
        raise ValueError(
            f"`{name}`: the JVP rule returned tangents whose structure does not match "
            f"the output's ({treedef}). Give one tangent per output array (`None` for "
            "a zero tangent)."
        ) from None
    t_leaves = [_zero_like(x) if t is None else t for x, t in zip(leaves, t_leaves)]
    return jax.tree_util.tree_unflatten(treedef, t_leaves)


def _split_rule_out(out: Any, t_out: Any, box: OutBox) -> Any:
    """The differentiable part of a JVP rule's output: its arrays, and the Python
    numbers that were given a tangent (JAX hands a rule the Python numbers passed
    to `jax.jvp` as they are, so its output may be numbers too)."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    try:
        t_leaves = treedef.flatten_up_to(t_out)
    except (ValueError, TypeError):  # tangents for the arrays only
        return split_out(out, box)
    keep = [
        is_array(x) or (t is not None and isinstance(x, (float, complex)))
        for x, t in zip(leaves, t_leaves)
    ]
    dynamic = [x if k else None for x, k in zip(leaves, keep)]
    box.put(treedef.unflatten([None if k else x for x, k in zip(leaves, keep)]))
    return treedef.unflatten(dynamic)


class filter_custom_jvp:
    """`jax.custom_jvp` for functions of arbitrary pytrees.

    The arguments are split automatically: the arrays of the positional arguments
    can be differentiated; everything else (and every keyword argument) is treated as
    non-differentiable, with a `None` tangent.

    ```python
    @boxwood.filter_custom_jvp
    def scaled_softplus(x, scale, *, name):
        return scale * jax.nn.softplus(x)

    @scaled_softplus.def_jvp
    def scaled_softplus_jvp(primals, tangents, *, name):
        x, scale = primals
        dx, dscale = tangents  # `None` for an argument without a tangent
        out = scaled_softplus(x, scale, name=name)
        dout = jnp.zeros_like(out)
        if dx is not None:
            dout = dout + scale * jax.nn.sigmoid(x) * dx
        if dscale is not None:
            dout = dout + jax.nn.softplus(x) * dscale
        return out, dout
    ```

    **Arguments:**

    - `fn`: the function, `fn(*args, **kwargs)`.

    The JVP rule is `fn_jvp(primals, tangents, **kwargs) -> (out, t_out)`, where
    `primals` is the tuple of positional arguments and `tangents` has its structure,
    with `None` for every leaf that is not being differentiated (non-arrays, integer
    arrays, and arrays with a zero tangent). `t_out` has the structure of `out`;
    `None` leaves mean zero tangents. Non-array leaves of `out` are returned as they
    are.
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.fn_jvp: Callable | None = None
        functools.update_wrapper(self, fn)

    def def_jvp(self, fn_jvp: Callable) -> Callable:
        """Set the JVP rule (see above); returns it, so usable as a decorator."""
        self.fn_jvp = fn_jvp
        return fn_jvp

    @hiding_own_frames
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self.fn, "__name__", "function")
        if self.fn_jvp is None:
            raise RuntimeError(
                f"`filter_custom_jvp`: no JVP rule for `{name}`; define one with "
                f"`@{name}.def_jvp` before calling it."
            )
        fn, fn_jvp = self.fn, self.fn_jvp
        dynamic, static = partition((args, kwargs), is_array)
        flat, treedef = jax.tree_util.tree_flatten(dynamic)
        box = OutBox()

        def rebuild(leaves: Any) -> tuple[tuple, dict]:
            # as in JAX (and Equinox): a Python number given to `jax.jvp` reaches
            # the rule as that number
            arrays = jax.tree_util.tree_unflatten(treedef, list(leaves))
            return combine(arrays, static)

        @jax.custom_jvp
        def run(*leaves: Any) -> Any:
            a, kw = rebuild(leaves)
            return split_out(fn(*a, **kw), box)

        def jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
            a, kw = rebuild(primals)
            t = [None if _is_zero(x) else x for x in tangents]
            t_args, t_kwargs = jax.tree_util.tree_unflatten(treedef, t)
            perturbed_kwargs = jax.tree_util.tree_flatten_with_path(t_kwargs)[0]
            if perturbed_kwargs:
                path = perturbed_kwargs[0][0]
                raise ValueError(
                    f"`{name}` was differentiated with respect to its keyword argument "
                    f"`{keystr(path)}`, but keyword arguments of a `filter_custom_jvp` "
                    "function are not differentiable. Pass it positionally."
                )
            out, t_out = fn_jvp(a, t_args, **kw)
            out_dynamic = _split_rule_out(out, t_out, box)
            return out_dynamic, _out_tangents(out_dynamic, t_out, name)

        run.defjvp(jvp, symbolic_zeros=True)
        return combine(run(*flat), box.get())


def _gradients(g: Any, call: _VjpCall) -> list:
    """The backward rule's `g` (the structure of `vjp_arg`, `None` for zeros),
    checked, as one gradient (or `None`) per differentiated leaf."""
    if g is None:
        return [None] * len(call.diff)
    try:
        given = call.vjp_def.flatten_up_to(g)
    except ValueError:
        raise ValueError(
            f"`{call.name}`: the backward rule must return gradients with the "
            f"structure of `vjp_arg` ({call.vjp_def}), with `None` for zero "
            f"gradients; got {jax.tree_util.tree_structure(g)}."
        ) from None
    grads = []
    for i in call.diff:
        gx, x = given[i], call.leaves[i]
        if gx is not None and jnp.shape(gx) != x.shape:
            raise ValueError(
                f"`{call.name}`: the backward rule returned a gradient of shape "
                f"{jnp.shape(gx)} for `{call.describe(i)}`, whose shape is "
                f"{x.shape}."
            )
        grads.append(gx)
    return grads


class NonDifferentiableArgumentError(ValueError, RuntimeError):
    """A `filter_custom_vjp` function differentiated with respect to an argument
    other than its first. A `RuntimeError` as in Equinox, and a `ValueError` as
    boxwood first raised it."""


class _VjpCall:
    """One call of a `filter_custom_vjp` function: the leaves of
    `(vjp_arg, args, kwargs)` and which of them JAX sees. `diff`: the positions of
    `vjp_arg`'s floating-point arrays (differentiated); `other`: those of every
    other array (which must not be perturbed); the rest is closed over."""

    def __init__(self, name: str, vjp_arg: Any, args: tuple, kwargs: dict) -> None:
        self.name = name
        self.vjp_def = jax.tree_util.tree_structure(vjp_arg)
        paired, self.treedef = jax.tree_util.tree_flatten_with_path(
            (vjp_arg, args, kwargs)
        )
        self.paths = [path for path, _ in paired]
        self.leaves = [leaf for _, leaf in paired]
        n = self.vjp_def.num_leaves
        self.diff = [i for i in range(n) if is_inexact_array(self.leaves[i])]
        self.other = [
            i
            for i, leaf in enumerate(self.leaves)
            if is_array(leaf) and not (i < n and is_inexact_array(leaf))
        ]

    def describe(self, i: int) -> str:
        path = self.paths[i]
        return ("vjp_arg", "args", "kwargs")[path[0].idx] + keystr(path[1:])

    def rebuild(self, diff: list, other: list) -> tuple[Any, tuple, dict]:
        """`(vjp_arg, args, kwargs)` with the given arrays (JAX may hand a rule the
        Python number a user gave as a primal: it becomes the array it was)."""
        leaves = list(self.leaves)
        for i, x in zip(self.diff + self.other, [*diff, *other]):
            leaves[i] = jnp.asarray(x)
        return self.treedef.unflatten(leaves)

    def perturbed(self, diff: list) -> Any:
        """`vjp_arg`'s structure with a bool at each leaf: differentiated or not."""
        flags = [False] * self.vjp_def.num_leaves
        for i, p in zip(self.diff, diff):
            flags[i] = bool(p.perturbed)
        return self.vjp_def.unflatten(flags)

    def refuse_perturbed(self, other: list) -> None:
        for i, p in zip(self.other, other):
            if p.perturbed:
                raise NonDifferentiableArgumentError(
                    f"`{self.name}` was differentiated with respect to "
                    f"`{self.describe(i)}`, which is not in its first argument. "
                    "`filter_custom_vjp` only computes gradients for the first "
                    "argument (`vjp_arg`): put everything to be differentiated "
                    "into it (e.g. as a tuple)."
                )


class filter_custom_vjp:
    """`jax.custom_vjp` for functions of arbitrary pytrees, differentiated with
    respect to their first argument.

    ```python
    @boxwood.filter_custom_vjp
    def fn(vjp_arg, *args, **kwargs):
        ...  # any pytrees in, any pytree out
        return out

    @fn.def_fwd
    def fn_fwd(perturbed, vjp_arg, *args, **kwargs):
        # `perturbed`: the structure of `vjp_arg`, a bool at every leaf: whether
        # that leaf is being differentiated.
        return out, residuals  # residuals: any pytree, kept for the backward pass

    @fn.def_bwd
    def fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args, **kwargs):
        # `grad_obj`: the cotangent of `out`, `None` where it is zero or not an array.
        return grad_vjp_arg  # the structure of `vjp_arg`; `None` for zero gradients
    ```

    Only the floating-point arrays of `vjp_arg` receive gradients. Differentiating
    with respect to an array in `args` or `kwargs` raises an error: pack everything to
    be differentiated into `vjp_arg` (e.g. a tuple). The backward rule receives all
    the inputs of the forward pass too.

    **Arguments:**

    - `fn`: the function, `fn(vjp_arg, *args, **kwargs)`.
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.fn_fwd: Callable | None = None
        self.fn_bwd: Callable | None = None
        functools.update_wrapper(self, fn)

    def def_fwd(self, fn_fwd: Callable) -> Callable:
        """Set the forward rule (see above); returns it, so usable as a decorator."""
        self.fn_fwd = fn_fwd
        return fn_fwd

    def def_bwd(self, fn_bwd: Callable) -> Callable:
        """Set the backward rule (see above); returns it, so usable as a decorator."""
        self.fn_bwd = fn_bwd
        return fn_bwd

    def defvjp(self, fn_fwd: Callable, fn_bwd: Callable) -> None:
        """Equinox's older form, kept for code written for it (deprecated there
        and here): `fn_fwd(vjp_arg, *args, **kwargs) -> (out, residuals)` and
        `fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs) -> grad_vjp_arg`,
        that is, the rules of `def_fwd` / `def_bwd` without `perturbed`."""
        warnings.warn(
            "`filter_custom_vjp.defvjp` is deprecated (as in Equinox): use "
            "`@fn.def_fwd` and `@fn.def_bwd`, whose rules also receive `perturbed`.",
            DeprecationWarning,
            stacklevel=2,
        )

        def fwd(perturbed: Any, *args: Any, **kwargs: Any) -> Any:
            return fn_fwd(*args, **kwargs)

        def bwd(residuals: Any, grad_obj: Any, perturbed: Any, *a: Any, **kw: Any):
            return fn_bwd(residuals, grad_obj, *a, **kw)

        self.fn_fwd, self.fn_bwd = fwd, bwd

    @hiding_own_frames
    def __call__(self, vjp_arg: Any, /, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self.fn, "__name__", "function")
        missing = [
            d
            for d, f in (("def_fwd", self.fn_fwd), ("def_bwd", self.fn_bwd))
            if f is None
        ]
        if missing:
            raise RuntimeError(
                f"`filter_custom_vjp`: `{name}` has no "
                f"{' or '.join(missing)} rule yet; define it with "
                f"`@{name}.{missing[0]}` before calling `{name}`."
            )
        call = _VjpCall(name, vjp_arg, args, kwargs)
        fn, fn_fwd, fn_bwd = self.fn, self.fn_fwd, self.fn_bwd
        assert fn_fwd is not None and fn_bwd is not None  # checked above
        box, saved = OutBox(), OutBox()

        @jax.custom_vjp
        def run(diff: list, other: list) -> Any:
            v, a, kw = call.rebuild(diff, other)
            return split_out(fn(v, *a, **kw), box)

        def fwd(diff: list, other: list) -> tuple[Any, Any]:
            call.refuse_perturbed(other)
            diff_values = [p.value for p in diff]
            other_values = [p.value for p in other]
            perturbed = call.perturbed(diff)
            v, a, kw = call.rebuild(diff_values, other_values)
            out, residuals = fn_fwd(perturbed, v, *a, **kw)
            kept = Slots(residuals, is_array)
            saved.put((kept, perturbed))
            arrays = (kept.picked(), diff_values, other_values)
            return split_out(out, box), arrays

        def bwd(arrays: Any, ct: Any) -> tuple[list, None]:
            residual_arrays, diff_values, other_values = arrays
            kept, perturbed = saved.get()
            v, a, kw = call.rebuild(diff_values, other_values)
            grad_obj = jax.tree.map(lambda c: None if _is_zero(c) else c, ct)
            g = fn_bwd(kept.rebuild(residual_arrays), grad_obj, perturbed, v, *a, **kw)
            return _gradients(g, call), None

        run.defvjp(fwd, bwd, symbolic_zeros=True)
        diff = [call.leaves[i] for i in call.diff]
        other = [call.leaves[i] for i in call.other]
        return combine(run(diff, other), box.get())
