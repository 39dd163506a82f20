"""`to_onnx` and `TreeWLCustom`: bridges to optional third-party packages."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._pretty import array_summary
from ._finalise import finalise_fn


def _onnx_tools() -> tuple:
    """`(tensorflow, tf2onnx, jax2tf)`, or an `ImportError` saying what to install."""
    try:
        import tensorflow as tf  # pyright: ignore[reportMissingImports, reportMissingModuleSource]
        import tf2onnx  # pyright: ignore[reportMissingImports]
        from jax.experimental import jax2tf
    except ImportError as e:
        raise ImportError(
            "`boxwood.internal.to_onnx` needs `tensorflow` and `tf2onnx`: "
            "`pip install tensorflow tf2onnx`."
        ) from e
    return tf, tf2onnx, jax2tf


def to_onnx(fn: Callable) -> Callable:
    """Export `fn` to ONNX (experimental): `to_onnx(fn)(*example_args)` returns
    what `tf2onnx.convert.from_function` returns for `fn` finalised (see
    [`boxwood.internal.finalise_fn`][]) and converted with `jax2tf`. Needs
    `tensorflow` and `tf2onnx` installed."""

    def export(*args: Any) -> Any:
        tf, tf2onnx, jax2tf = _onnx_tools()
        # no XLA-only operations, which ONNX could not express
        converted = jax2tf.convert(finalise_fn(fn), enable_xla=False)
        signature = [tf.TensorSpec(jnp.shape(x), jnp.result_type(x)) for x in args]
        return tf2onnx.convert.from_function(
            tf.function(converted), input_signature=signature
        )

    return export


@dataclasses.dataclass(frozen=True)
class TreeWLCustom:
    """A customisation for the `wadler_lindig` pretty-printer (its `custom=`
    argument): returns a document for the nodes printed specially, `None` for the
    rest.

    - `truncate_leaf`: nodes for which it is true print as `TypeName(...)`.
    - `short_arrays`: arrays print as their dtype and shape (`f32[2,3]`).
    - `struct_as_array`: so do `jax.ShapeDtypeStruct`s (with `short_arrays`).
    """

    truncate_leaf: Callable[[Any], bool]
    short_arrays: bool
    struct_as_array: bool

    def __call__(self, obj: Any) -> Any:
        import wadler_lindig as wl

        if self.truncate_leaf(obj):
            return wl.TextDoc(f"{type(obj).__name__}(...)")
        if self.short_arrays and (
            isinstance(obj, jax.Array)
            or (self.struct_as_array and isinstance(obj, jax.ShapeDtypeStruct))
        ):
            return wl.TextDoc(array_summary(obj))
        if isinstance(obj, (jax.custom_jvp, jax.custom_vjp)):
            return wl.pdoc(obj.__wrapped__)
        return None
