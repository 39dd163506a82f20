"""`noinline`: call a function as one operation of the enclosing program.

The function's code is looked up at run time: a `noinline` wrapper holds its
arrays and a small integer array, the *ticket*, that names its code in
`_tickets`. Inside a compiled program the operation is a host callback that reads
the ticket and runs the function's own executable (on the host's CPU), compiled
once per ticket and signature (`_executable`). So the function's body is compiled
once, not into each caller, and two wrappers that share an `abstract_fn` are
interchangeable arguments of a compiled caller: they differ only in their arrays.

What the operation computes is a `_Program`: the wrapped call (`_Call`), or a
transformation of another (`_Batched` for `vmap`, `_Tangent` for forward mode,
`_Cotangent` for reverse mode), hashable by value: call sites with the same
signature share one executable.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray, Tracer
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._filters import combine, is_array, partition
from .._module import Module, ValueKey, field
from .._transforms import (
    filter_eval_shape,
    follow_wrapped_annotations,
    wrapped_qualname,
)
from ._finalise import primitive_finalisations
from ._misc import cached_filter_eval_shape

_tu = jax.tree_util


class _Tickets:
    """The code of every wrapped function, by ticket. Equal code (or, when it is
    unhashable, the same object) gets the same ticket."""

    def __init__(self) -> None:
        self._code: list = []
        self._numbers: dict = {}

    def issue(self, code: Any) -> np.ndarray:
        key = ValueKey(code)
        number = self._numbers.setdefault(key, len(self._code))
        if number == len(self._code):
            self._code.append(code)
        return np.array(number, dtype=np.int32)

    def code(self, ticket: Any) -> Any:
        try:
            return self._code[int(ticket)]
        except (IndexError, TypeError, ValueError) as e:
            raise ValueError(
                f"`noinline`: {ticket!r} is not the ticket of a wrapped function. "
                "A `noinline` wrapper's integer leaf names its code: leave it "
                "unchanged when mapping over the wrapper's leaves."
            ) from e


_tickets = _Tickets()


@dataclasses.dataclass(frozen=True)
class _Flat:
    """A pytree taken apart: its structure, which leaves are arrays, and the
    other leaves (as `ValueKey`s)."""

    treedef: Any
    is_operand: tuple
    statics: tuple

    @staticmethod
    def of(tree: Any, operand: Callable = is_array) -> tuple[list, _Flat]:
        leaves, treedef = _tu.tree_flatten(tree)
        mask = tuple(bool(operand(x)) for x in leaves)
        statics = tuple(ValueKey(x) for x, m in zip(leaves, mask) if not m)
        arrays = [x for x, m in zip(leaves, mask) if m]
        return arrays, _Flat(treedef, mask, statics)

    def assemble(self, operands: Sequence) -> Any:
        arrays, statics = iter(operands), iter(self.statics)
        leaves = [next(arrays) if m else next(statics).value for m in self.is_operand]
        return _tu.tree_unflatten(self.treedef, leaves)


@dataclasses.dataclass(frozen=True)
class _Program(abc.ABC):
    """What the operation computes from its operands (all but the ticket);
    `outs` are the abstract values of its results."""

    outs: tuple

    @abc.abstractmethod
    def flat(self, code: Any) -> Callable:
        """The computation on flat operands, for the function's `code`."""


@dataclasses.dataclass(frozen=True)
class _Call(_Program):
    """`fn(*args, **kwargs)`, with `fn` rebuilt from its arrays and `code`."""

    inputs: _Flat
    output: _Flat

    def flat(self, code: Any) -> Callable:
        def run(*operands: Any) -> list:
            fn_arrays, args, kwargs = self.inputs.assemble(operands)
            out = combine(fn_arrays, code)(*args, **kwargs)
            arrays, layout = _Flat.of(out)
            if layout.is_operand != self.output.is_operand or (
                layout.treedef != self.output.treedef
            ):
                raise ValueError(
                    "`noinline`: the function returned a pytree of structure "
                    f"{layout.treedef}, but its abstract evaluation gave "
                    f"{self.output.treedef} (or arrays in other places). Make "
                    "`abstract_fn` return what the function returns."
                )
            return [jnp.asarray(a) for a in arrays]

        return run


@dataclasses.dataclass(frozen=True)
class _Batched(_Program):
    """`inner` under `jax.vmap`, operand `i` mapped along `in_axes[i]`, every
    result along axis 0."""

    inner: _Program
    in_axes: tuple
    size: int
    name: Any

    def flat(self, code: Any) -> Callable:
        axes = dict(in_axes=self.in_axes, axis_size=self.size, axis_name=self.name)
        return jax.vmap(self.inner.flat(code), **axes)


def _with(primals: Sequence, chosen: Sequence[bool], replaced: Sequence) -> list:
    it = iter(replaced)
    return [next(it) if c else p for p, c in zip(primals, chosen)]


def _pick(values: Sequence, chosen: Sequence[bool]) -> list:
    return [v for v, c in zip(values, chosen) if c]


@dataclasses.dataclass(frozen=True)
class _Tangent(_Program):
    """The tangents of `inner`'s floating results, given all its operands and
    the tangents of the `varied` ones (the others have zero tangents)."""

    inner: _Program
    varied: tuple
    floating: tuple

    def restricted(self, code: Any, primals: Sequence) -> Callable:
        inner = self.inner.flat(code)

        def run(*varied: Any) -> list:
            return _pick(inner(*_with(primals, self.varied, varied)), self.floating)

        return run

    def flat(self, code: Any) -> Callable:
        count = len(self.varied)

        def run(*operands: Any) -> list:
            primals, tangents = operands[:count], operands[count:]
            fn = self.restricted(code, primals)
            return jax.jvp(fn, _pick(primals, self.varied), list(tangents))[1]

        return run


@dataclasses.dataclass(frozen=True)
class _Cotangent(_Program):
    """The transpose of `tangent` (a `_Tangent`): given all the operands of its
    inner program and the cotangents of its `live` results, the cotangents of the
    varied operands."""

    tangent: _Tangent
    live: tuple

    def flat(self, code: Any) -> Callable:
        count = len(self.tangent.varied)
        results = _pick(self.tangent.inner.outs, self.tangent.floating)

        def run(*operands: Any) -> list:
            primals, live_cts = operands[:count], operands[count:]
            fn = self.tangent.restricted(code, primals)
            _, pullback = jax.vjp(fn, *_pick(primals, self.tangent.varied))
            cts = _with(
                [jnp.zeros(r.shape, r.dtype) for r in results], self.live, live_cts
            )
            return list(pullback(cts))

        return run


# --- the primitive ------------------------------------------------------------
# Operands: the ticket, then the program's operands. Parameter: `program`.


@functools.lru_cache(maxsize=512)
def _executable(program: _Program, ticket: int) -> Callable:
    """`program` for the code of `ticket`, compiled once (per operand types)."""
    return jax.jit(program.flat(_tickets.code(ticket)))


def _impl(ticket: Any, *operands: Any, program: _Program) -> list:
    return list(_executable(program, int(ticket))(*operands))


def _abstract_eval(*avals: Any, program: _Program) -> list:
    return list(program.outs)


@functools.cache
def _host_cpu() -> Any:
    """The host's CPU device; without one (JAX_PLATFORMS naming accelerators
    only), `None` (the default device), or on a TPU (it would wait on itself) an error."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        if jax.default_backend() != "tpu":
            return None
        raise RuntimeError(
            "noinline: a compiled call runs the function on the host's CPU, and JAX "
            "has no CPU backend; add cpu to JAX_PLATFORMS (e.g. JAX_PLATFORMS=tpu,cpu)."
        ) from None


def _on_host(program: _Program) -> Callable:
    """The host side: runs the function's executable on the caller's operands on
    the host's CPU (the caller holds its device; a TPU would wait on itself)."""
    found: dict[int, Callable] = {}  # this call site's executables, by ticket

    def run(ticket: Any, *operands: Any) -> tuple:
        number = int(ticket)
        if number not in found:
            found[number] = _executable(program, number)
        with jax.default_device(_host_cpu()):
            return tuple(np.asarray(x) for x in found[number](*operands))

    return run


def _through_callback(ticket: Any, *operands: Any, program: _Program) -> list:
    """The operation as `jax.pure_callback`, which places the call to the host
    in programs partitioned over several devices."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in program.outs]
    return list(jax.pure_callback(_on_host(program), shapes, ticket, *operands))


_through_callback_lowering = mlir.lower_fun(_through_callback, multiple_results=True)


def _lower(ctx: Any, ticket: Any, *operands: Any, program: _Program) -> Any:
    """The operation inside a compiled program: a call back to the host, emitted
    directly where the program runs on one device."""
    _host_cpu()  # (raises on a TPU without one)
    if getattr(ctx.module_context.axis_context, "num_devices", None) != 1:
        return _through_callback_lowering(ctx, ticket, *operands, program=program)
    results, _, _ = mlir.emit_python_callback(
        ctx,
        _on_host(program),
        None,
        [ticket, *operands],
        ctx.avals_in,
        ctx.avals_out,
        has_side_effect=False,
        returns_token=False,
    )
    return results


def _inline(ticket: Any, *operands: Any, program: _Program) -> list:
    """Finalisation: the function's operations in place of the operation, when
    the ticket is known while tracing (a host callback otherwise)."""
    if isinstance(ticket, Tracer):
        return _through_callback(ticket, *operands, program=program)
    return list(program.flat(_tickets.code(ticket))(*operands))


def _is_zero(t: Any) -> bool:
    return isinstance(t, ad.Zero) or jnp.result_type(t) == jax.dtypes.float0


def _jvp(primals: Sequence, tangents: Sequence, *, program: _Program) -> tuple:
    ticket, operands = primals[0], primals[1:]
    outs = noinline_p.bind(*primals, program=program)
    varied = tuple(not _is_zero(t) for t in tangents[1:])
    floating = tuple(jnp.issubdtype(a.dtype, jnp.inexact) for a in program.outs)
    zeros = [ad.Zero(a.to_tangent_aval()) for a in program.outs]
    if not any(varied) or not any(floating):
        return outs, zeros
    tangent = _Tangent(
        outs=tuple(a.to_tangent_aval() for a in _pick(program.outs, floating)),
        inner=program,
        varied=varied,
        floating=floating,
    )
    live = _pick(tangents[1:], varied)
    t_outs = noinline_p.bind(ticket, *operands, *live, program=tangent)
    return outs, _with(zeros, floating, t_outs)


def _aval(x: Any) -> Any:
    return x.aval if ad.is_undefined_primal(x) else jax.typeof(x)


def _transpose(cts: Sequence, ticket: Any, *operands: Any, program: _Program):
    count = len(getattr(program, "varied", ()))
    if not isinstance(program, _Tangent) or any(
        ad.is_undefined_primal(x) for x in (ticket, *operands[:count])
    ):
        raise NotImplementedError(
            "`noinline`: the primitive was transposed directly. Differentiate the "
            "function calling it instead (its JVP is a `noinline` operation that "
            "can be transposed)."
        )
    primals, tangents = operands[:count], operands[count:]
    live = tuple(not isinstance(c, ad.Zero) for c in cts)
    if not any(live):
        return [None] * (1 + count) + [_zero_ct(t) for t in tangents]
    cotangent = _Cotangent(
        outs=tuple(_aval(t) for t in tangents), tangent=program, live=live
    )
    cts_in = noinline_p.bind(ticket, *primals, *_pick(cts, live), program=cotangent)
    return [None] * (1 + count) + [
        c if ad.is_undefined_primal(t) else None for c, t in zip(cts_in, tangents)
    ]


def _zero_ct(t: Any) -> Any:
    return ad.Zero(t.aval) if ad.is_undefined_primal(t) else None


def _batch(axis_data: Any, args: Sequence, dims: Sequence, *, program: _Program):
    if dims[0] is not None:
        raise ValueError(
            "`noinline`: `vmap` mapped over the wrapped function itself (its integer "
            "ticket leaf). Map over the arguments only, e.g. `in_axes=(None, 0)` "
            "for `filter_vmap(lambda f, x: f(x))`."
        )
    if all(d is None for d in dims):
        outs = noinline_p.bind(*args, program=program)
        return outs, [None] * len(outs)
    size = axis_data.size
    batched = _Batched(
        outs=tuple(a.update(shape=(size, *a.shape)) for a in program.outs),
        inner=program,
        in_axes=tuple(dims[1:]),
        size=size,
        name=axis_data.name,
    )
    outs = noinline_p.bind(*args, program=batched)
    return outs, [0] * len(outs)


def _new_primitive() -> Primitive:
    """The primitive: every call of a `noinline` wrapper, and of its transforms,
    binds it."""
    prim = Primitive("boxwood_noinline")
    prim.multiple_results = True
    prim.def_impl(_impl)
    prim.def_abstract_eval(_abstract_eval)
    ad.primitive_jvps[prim], ad.primitive_transposes[prim] = _jvp, _transpose
    batching.fancy_primitive_batchers[prim] = _batch
    primitive_finalisations[prim] = _inline
    mlir.register_lowering(prim, _lower, cacheable=False)
    return prim


noinline_p = _new_primitive()


# --- the wrapper --------------------------------------------------------------


def _eval_shape(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    try:  # traced once per signature, where the arguments are hashable
        return cached_filter_eval_shape(fn, *args, **kwargs)
    except TypeError:
        return filter_eval_shape(fn, *args, **kwargs)


def _call_with(fn: Any, args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


class _NoInline(Module):
    # Leaves: the function's arrays and its ticket. `shape_code` (the function's
    # code, when there is no `abstract_fn`) gives the output's shapes.
    fn_arrays: Any
    ticket: Any
    abstract_fn: Any = field(static=True)
    shape_code: Any = field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        operands, inputs = _Flat.of((self.fn_arrays, args, kwargs))
        if self.abstract_fn is None:
            fn = combine(self.fn_arrays, self.shape_code)
            out = _eval_shape(_call_with, fn, args, kwargs)
        else:
            out = _eval_shape(self.abstract_fn, self.fn_arrays, *args, **kwargs)
        structs, output = _Flat.of(out, lambda s: isinstance(s, jax.ShapeDtypeStruct))
        program = _Call(
            outs=tuple(ShapedArray(s.shape, s.dtype, s.weak_type) for s in structs),
            inputs=inputs,
            output=output,
        )
        return output.assemble(noinline_p.bind(self.ticket, *operands, program=program))

    # It looks like the function it wraps (`abstract_fn` when given, as in Equinox),
    # as `functools.wraps` would make it.
    @property
    def __wrapped__(self) -> Any:
        if self.abstract_fn is not None:
            return self.abstract_fn
        return combine(self.fn_arrays, self.shape_code)

    @property
    def __name__(self) -> str:  # type: ignore[override]
        return getattr(self.__wrapped__, "__name__", type(self).__name__)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return getattr(self.__wrapped__, "__doc__", None)

    def __getattr__(self, name: str) -> Any:
        if name == "__qualname__":  # see `Wrapped.__getattr__`
            return wrapped_qualname(self)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}"
        )


follow_wrapped_annotations(_NoInline)


def noinline(fn: Callable, abstract_fn: Callable | None = None) -> Callable:
    """`fn` as a single operation of the programs calling it: its body is compiled
    once, as its own executable, and called from every call site instead of being
    traced into each caller (saving compile time for a function called from many
    places, at some run-time cost: inside a compiled program each call goes
    through the host, whose CPU runs the body: on a TPU, JAX_PLATFORMS must allow cpu).

    **Arguments:**

    - `fn`: any callable pytree; its arrays are inputs of the operation.
    - `abstract_fn`: gives the output's shapes and dtypes, called as
      `filter_eval_shape(abstract_fn, filter(fn, is_array), *args, **kwargs)`;
      by default `fn` itself is traced for them. With an `abstract_fn`, wrappers of
      different functions sharing it have the same pytree structure, so passing
      one or the other to a compiled caller does not retrace or recompile it.

    **Returns:**

    A callable pytree behaving as `fn` under `jit`, `grad` (forward and reverse
    mode) and `vmap`. Its leaves are `fn`'s arrays and an integer scalar naming
    `fn`'s code: `vmap` over its arguments, not over the wrapper itself.
    """
    arrays, code = partition(fn, is_array)
    shape_code = code if abstract_fn is None else None
    return _NoInline(arrays, _tickets.issue(code), abstract_fn, shape_code)
