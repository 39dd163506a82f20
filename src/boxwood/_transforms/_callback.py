"""`filter_pure_callback`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._filters import is_array
from ._split import Slots, describe, keystr, static_equal


def _is_struct(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _output_arrays(out: Any, want: list, want_def: Any) -> list:
    """The arrays of the callback's `out`, checked against `result_shape_dtypes`."""
    got, got_def = jax.tree_util.tree_flatten(out)
    if got_def != want_def:
        raise ValueError(
            "`filter_pure_callback`: the callback returned an output of structure "
            f"{got_def}, but `result_shape_dtypes` has structure {want_def}."
        )
    arrays = []
    for (path, w), g in zip(want, got):
        if _is_struct(w):
            arrays.append(g if is_array(g) else np.asarray(g, dtype=w.dtype))
        elif not static_equal(w, g):
            raise ValueError(
                f"`filter_pure_callback`: the callback returned {describe(g)} at "
                f"`output{keystr(path)}`, but `result_shape_dtypes` has {describe(w)} "
                "there. Non-array outputs must equal those of `result_shape_dtypes`."
            )
    return arrays


def _vmap_method(vmap_method: str | None, vectorized: bool | None) -> str | None:
    if vectorized is None:
        return vmap_method
    if vmap_method is not None:
        raise ValueError(
            "`filter_pure_callback` takes `vmap_method=` or the older `vectorized=`, "
            "not both."
        )
    method = "legacy_vectorized" if vectorized else "sequential"
    warnings.warn(
        f"`filter_pure_callback(vectorized={vectorized})` is deprecated; pass "
        f"`vmap_method={method!r}` instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    return method


def filter_pure_callback(
    callback: Callable,
    *args: Any,
    result_shape_dtypes: Any,
    sharding: Any = None,
    vmap_method: str | None = None,
    vectorized: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Call a Python function from inside `jax.jit`; `jax.pure_callback` for
    arbitrary Python objects.

    The arrays of `args` and `kwargs` reach `callback` as concrete arrays (on the
    host); every other leaf is passed as it is.

    **Arguments:**

    - `callback`: the Python function, called as `callback(*args, **kwargs)`. It
      must be pure (JAX may skip or repeat the call).
    - `*args`, `**kwargs`: its arguments, any pytrees.
    - `result_shape_dtypes`: the output of `callback`, with a `jax.ShapeDtypeStruct`
      (or anything with `.shape` and `.dtype`) for each array. Its other leaves must
      equal the non-array outputs of `callback`. Keyword-only.
    - `sharding`, `vmap_method`: as in `jax.pure_callback`.
    - `vectorized`: JAX's older form of `vmap_method` (deprecated, with a
      `DeprecationWarning`): `True` is `vmap_method="legacy_vectorized"`, `False`
      is `"sequential"`.

    **Returns:**

    The output of `callback`.

    >>> import boxwood, jax, jax.numpy as jnp, numpy as np
    >>> def host(x, *, label):
    ...     return np.sort(np.asarray(x)), label
    >>> out = jax.ShapeDtypeStruct((3,), jnp.float32)
    >>> def f(x):
    ...     y, label = boxwood.filter_pure_callback(
    ...         host, x, label="sorted", result_shape_dtypes=(out, "sorted"))
    ...     return y
    >>> jax.jit(f)(jnp.array([3.0, 1.0, 2.0]))
    Array([1., 2., 3.], dtype=float32)
    """
    vmap_method = _vmap_method(vmap_method, vectorized)
    inputs = Slots((args, kwargs), is_array)
    want, want_def = jax.tree_util.tree_flatten_with_path(result_shape_dtypes)
    structs = [jax.ShapeDtypeStruct(w.shape, w.dtype) for _, w in want if _is_struct(w)]

    def host_callback(arrays: list) -> list:
        a, kw = inputs.rebuild(arrays)
        return _output_arrays(callback(*a, **kw), want, want_def)

    options: dict[str, Any] = {"vmap_method": vmap_method}
    if sharding is not None:
        options["sharding"] = sharding
    arrays = iter(jax.pure_callback(host_callback, structs, inputs.picked(), **options))
    leaves = [next(arrays) if _is_struct(w) else w for _, w in want]
    return jax.tree_util.tree_unflatten(want_def, leaves)
