"""Small helpers of Equinox's internal API: `scan_trick`, `eval_empty`,
`eval_zero`, `str2jax`, `nextafter`, `prevbefore`, `left_broadcast_to`,
`hashable_partition`, `hashable_combine`, `cached_filter_eval_shape`,
`ContainerMeta`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._errors import error_if
from .._filters import combine, is_array, partition
from .._module import Module
from .._transforms import filter_eval_shape


def scan_trick(fn: Callable, intermediates: Sequence[Callable], init: Any) -> Any:
    """Compute `fn` once in the compiled program although it is called
    `len(intermediates) + 1` times: `init -> fn -> intermediates[0] -> fn -> ... ->
    intermediates[-1] -> fn`, as one `lax.scan` whose body calls `fn` once and then
    the step's intermediate function (picked with `lax.switch`).

    >>> import jax.numpy as jnp
    >>> from boxwood.internal import scan_trick
    >>> scan_trick(lambda x: x * 2, [lambda x: x + 1], jnp.array(1.0))  # (1*2+1)*2
    Array(6., dtype=float32, weak_type=True)
    """
    afterwards = (*intermediates, _identity)

    def step(state: tuple, _: None) -> tuple:
        count, x = state  # `count` never depends on `x`, so it is never batched
        x = jax.lax.switch(count, afterwards, fn(x))
        return (count + 1, x), None

    start = (jnp.zeros((), jnp.int32), init)
    (_, out), _ = jax.lax.scan(step, start, None, length=len(afterwards))
    return out


def _identity(x: Any) -> Any:
    return x


def _eval_filled(fill: Callable, fn: Callable, inputs: tuple) -> Any:
    out = filter_eval_shape(fn, *inputs)
    return jax.tree_util.tree_map(lambda s: fill(s.shape, s.dtype), out)


def eval_empty(fn: Callable, *inputs: Any) -> Any:
    """Arrays shaped as the output of `fn(*inputs)`, without running `fn` (their
    contents are unspecified)."""
    return _eval_filled(jnp.empty, fn, inputs)


def eval_zero(fn: Callable, *inputs: Any) -> Any:
    """Arrays of zeros shaped as the output of `fn(*inputs)`, without running `fn`."""
    return _eval_filled(jnp.zeros, fn, inputs)


def eval_full(fn: Callable, *inputs: Any, fill_value: Any) -> Any:
    """Arrays of `fill_value` shaped as the output of `fn(*inputs)`."""
    return _eval_filled(functools.partial(_full, fill_value), fn, inputs)


def _full(fill_value: Any, shape: tuple, dtype: Any) -> Any:
    return jnp.full(shape, fill_value, dtype)


def str2jax(msg: str) -> Module:
    """A module without fields (so a static pytree, usable as a `jit` argument or
    carried through `lax` control flow) whose `str` and `repr` are `msg`."""

    def show(self: Any) -> str:
        return msg

    text_type = type(msg, (Module,), {"__repr__": show, "__str__": show})
    return text_type()


def _float_neighbour(name: str, towards: float, doc: str) -> Any:
    """The floating-point number next to `x` in the direction `towards` (+inf or
    -inf), with the identity's derivative. From zero it goes to the smallest
    *normal* number: XLA flushes subnormals to zero, which would leave it at zero.

    It is `jax.jit`-compiled, so that inside a trace a call is one cached
    operation rather than a fresh trace of its body: diffrax calls `prevbefore`
    100 times in a row per solve, which otherwise doubled the lowered program."""

    @jax.custom_jvp
    def neighbour(x: Any) -> Any:
        x = jnp.asarray(x)
        tiny = jnp.finfo(x.dtype).tiny
        edge = tiny if towards > 0 else -tiny
        return jnp.where(x == 0, edge, jnp.nextafter(x, jnp.asarray(towards, x.dtype)))

    @neighbour.defjvp
    def _jvp(primals: tuple, tangents: tuple) -> tuple:
        (x,), (dx,) = primals, tangents
        return neighbour(x), dx

    neighbour.__name__ = neighbour.__qualname__ = name  # pyright: ignore[reportAttributeAccessIssue]
    compiled = jax.jit(neighbour)
    compiled.__doc__ = doc
    return compiled


nextafter = _float_neighbour(
    "nextafter",
    float("inf"),
    """The next floating-point number above `x`; above zero, the smallest normal
    number. Its derivative is that of the identity.""",
)
prevbefore = _float_neighbour(
    "prevbefore",
    float("-inf"),
    """The previous floating-point number below `x`; below zero, minus the
    smallest normal number. Its derivative is that of the identity.""",
)


def left_broadcast_to(arr: Any, shape: tuple) -> Any:
    """Broadcast `arr` to `shape`, lining up its axes with the *leading* axes of
    `shape` (trailing axes are added), unlike NumPy's right-aligned rule."""
    arr = jnp.asarray(arr)
    trailing = tuple(range(arr.ndim, len(shape)))
    return jnp.broadcast_to(jnp.expand_dims(arr, trailing), shape)


def hashable_partition(pytree: Any, filter_fn: Callable) -> tuple:
    """Split `pytree`'s leaves by `filter_fn`: `(selected, (others, treedef))`,
    tuples with `None` in the places of the other kind; the second part is
    hashable when the unselected leaves are."""
    leaves, treedef = jax.tree_util.tree_flatten(pytree)
    dynamic, static = partition(tuple(leaves), filter_fn)
    return dynamic, (static, treedef)


def hashable_combine(dynamic: Any, static: tuple) -> Any:
    """Inverse of [`boxwood.internal.hashable_partition`][]."""
    static_leaves, treedef = static
    return jax.tree_util.tree_unflatten(treedef, combine(dynamic, static_leaves))


def _as_struct(x: Any) -> Any:
    """An array's shape, dtype and weak type (a weakly typed `jnp.where(c, 1, -1)`
    must stay weak, or `t * direction` fails under strict promotion)."""
    if not is_array(x):
        return x
    weak = bool(getattr(getattr(x, "aval", None), "weak_type", False))
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x), weak_type=weak)


@functools.cache
def _eval_shape_cached(leaves: tuple, treedef: Any) -> Any:
    fn, args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    return filter_eval_shape(fn, *args, **kwargs)


def cached_filter_eval_shape(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """[`boxwood.filter_eval_shape`][], remembered for the same function, the same
    non-array arguments and arrays of the same shapes and dtypes (all of which
    must be hashable)."""
    leaves, treedef = jax.tree_util.tree_flatten(
        jax.tree_util.tree_map(_as_struct, (fn, args, kwargs))
    )
    return _eval_shape_cached(tuple(leaves), treedef)


class ContainerMeta(type):
    """Metaclass of an old-style enumeration (superseded by
    [`boxwood.Enumeration`][]): each non-dunder attribute of the class becomes its
    index, `Cls[i]` gives the value back, `len(Cls)` counts them, and
    `isinstance(x, Cls)` accepts ints and integer scalar arrays."""

    reverse_lookup: list

    def __new__(mcs, name: str, bases: tuple, namespace: dict) -> Any:
        if "reverse_lookup" in namespace:
            raise ValueError(
                "ContainerMeta: `reverse_lookup` is reserved (it holds the values); "
                "rename that attribute."
            )
        members = [key for key in namespace if not _is_dunder(key)]
        numbered = {key: number for number, key in enumerate(members)}
        cls = super().__new__(mcs, name, bases, {**namespace, **numbered})
        cls.reverse_lookup = [namespace[key] for key in members]
        return cls

    def __instancecheck__(cls, instance: Any) -> bool:
        return _is_integer_scalar(instance) or type.__instancecheck__(cls, instance)

    def __getitem__(cls, item: int) -> Any:
        return cls.reverse_lookup[item]

    def __len__(cls) -> int:
        return len(cls.reverse_lookup)


def _is_dunder(name: str) -> bool:
    return name[:2] == name[-2:] == "__"


def _is_integer_scalar(x: Any) -> bool:
    """A Python int (or bool), or a 0-d array or NumPy scalar of an integer dtype."""
    if isinstance(x, int):
        return True
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return x.ndim == 0 and jnp.issubdtype(x.dtype, jnp.integer)
    return False


def assert_dce(x: Any, msg: str, *, on_error: str = "default") -> Any:
    """`x`, with a run-time error (`msg`) if `x` is still used once the compiler has
    removed dead code: under `jit`, `x` passes through an error check that always
    fails, so the program raises unless that check is eliminated with `x`. Outside
    `jit` nothing is eliminated, so nothing is checked."""
    if not isinstance(jnp.asarray(1) + 1, jax.core.Tracer):
        return x
    # `~False` (not `True`): an error known at trace time would raise right away.
    return error_if(x, jnp.invert(False), msg, on_error=on_error)
