"""Range checks of integer id arrays (`input_ids`, BERT's `token_type_ids`):
an id indexes an embedding table, where JAX would clamp one
past the end to the last row and wrap a negative one around, silently."""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._errors import error_if


def check_ids_below(
    model: str,
    argument: str,
    ids: jax.Array,
    size: int,
    option: str,
    rule: str | None = None,
) -> jax.Array:
    """`ids` (the model's argument `argument`, integers) must lie in `[0, size)`,
    `size` being the config option `option`; `rule` words the requirement in
    the error (default: the range and the option).

    On concrete arrays a bad id raises `ValueError` at once, naming the first one
    and its position; under a trace the check is a `boxwood.error_if` attached to
    the returned array, so use the result.
    """
    dtype = jnp.result_type(ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(
            f"{model}: `{argument}` must be an integer array of ids, got dtype "
            f"{dtype}. Convert it with `.astype(jnp.int32)`."
        )
    rule = rule or (
        f"{model}: `{argument}` must hold ids from 0 to {size - 1} "
        f"(`{option}` = {size} in the config)"
    )
    if isinstance(ids, jax.core.Tracer):
        bad = (ids < 0) | (ids >= size)
        checked: Any = error_if(ids, bad, f"{rule}; got an id outside that range.")
        return checked
    values = np.asarray(ids)
    where = np.flatnonzero((values < 0) | (values >= size))
    if where.size:
        first = int(where[0])
        raise ValueError(
            f"{rule}; got {int(values[first])} at position {first} "
            f"({where.size} out of range in all)."
        )
    return ids
